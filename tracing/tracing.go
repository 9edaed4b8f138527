// Package tracing builds delayd's OpenTelemetry tracer provider from the
// standard OTEL_* environment variables, so tracing is configured the way
// every OpenTelemetry SDK is, and is off when they are unset.
//
// Tracing is on when OTEL_TRACES_EXPORTER is "otlp" or an OTLP endpoint is
// set (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT),
// and off when OTEL_SDK_DISABLED is "true" or OTEL_TRACES_EXPORTER is
// "none". The exporter reads the rest of its OTEL_EXPORTER_OTLP_* settings
// (headers, TLS, timeout); OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL picks "grpc"
// or "http/protobuf" (the default); OTEL_TRACES_SAMPLER[_ARG] picks the
// sampler; OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES name the process
// (service.name defaults to "delayd").
package tracing

import (
	"context"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Propagator is the W3C trace context and baggage propagator delayd's
// server and Go client use on the wire.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// Enabled tells whether the environment turns tracing on.
func Enabled() bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	switch strings.ToLower(os.Getenv("OTEL_TRACES_EXPORTER")) {
	case "none":
		return false
	case "otlp":
		return true
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// FromEnv returns the tracer provider the environment configures, or nil
// (tracing off) when Enabled is false. Shut it down to flush its spans.
func FromEnv(ctx context.Context) (*sdktrace.TracerProvider, error) {
	if !Enabled() {
		return nil, nil
	}
	if x := strings.ToLower(os.Getenv("OTEL_TRACES_EXPORTER")); x != "" && x != "otlp" {
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: allowed: otlp, none", x)
	}
	proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var exp sdktrace.SpanExporter
	var err error
	switch proto {
	case "", "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q: allowed: grpc, http/protobuf", proto)
	}
	if err != nil {
		return nil, fmt.Errorf("otlp trace exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "delayd")),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil {
		return nil, fmt.Errorf("otel resource: %w", err)
	}
	// The sampler comes from OTEL_TRACES_SAMPLER (default: parent-based,
	// always on).
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}
