package client_test

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/daemon"
)

// TestConsumerSpanLinksToProducerSpan traces a task end to end, each side
// with its own in-memory exporter: the producer's span reaches delayd over
// the wire (the server's UpsertTask span is its child), delayd keeps that
// trace context with the task across the delay, and the consumer's handler
// span, started by Consume, links back to the server's UpsertTask span in
// the producer's trace.
func TestConsumerSpanLinksToProducerSpan(t *testing.T) {
	t.Parallel()
	serverSpans := tracetest.NewInMemoryExporter()
	serverTP := sdktrace.NewTracerProvider(sdktrace.WithSyncer(serverSpans))
	clientSpans := tracetest.NewInMemoryExporter()
	clientTP := sdktrace.NewTracerProvider(sdktrace.WithSyncer(clientSpans))
	t.Cleanup(func() { _ = serverTP.Shutdown(context.Background()); _ = clientTP.Shutdown(context.Background()) })

	srv := startDelaydWith(t, daemon.Config{TracerProvider: serverTP})
	c, err := client.New(srv.addr(), client.WithTracerProvider(clientTP))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ns := namespace(t, c)

	// Produce inside a span of the producer's own.
	ctx, produce := clientTP.Tracer("producer").Start(t.Context(), "close order later")
	if _, err := c.Upsert(ctx, ns, client.TaskSpec{ID: "order-1", Payload: []byte("p"), When: client.After(200 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	produce.End()
	producerTrace := produce.SpanContext().TraceID()

	// Consume: the handler records the span it runs in.
	handled := make(chan trace.SpanContext, 1)
	cctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- c.Consume(cctx, ns, func(ctx context.Context, d *client.Delivery) error {
			if d.TraceParent == "" {
				t.Errorf("delivery of %s carries no trace context", d.ID)
			}
			select {
			case handled <- trace.SpanContextFromContext(ctx):
			default:
			}
			return nil
		}, client.ConsumeOptions{})
	}()
	var handlerSpan trace.SpanContext
	select {
	case handlerSpan = <-handled:
	case <-time.After(20 * time.Second):
		t.Fatal("task never delivered")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Consume: %v", err)
	}

	// The server's UpsertTask span is in the producer's trace.
	var upsertSpan sdktrace.ReadOnlySpan
	for _, s := range serverSpans.GetSpans().Snapshots() {
		if s.Name() == "delayd.v1.TaskService/UpsertTask" {
			upsertSpan = s
		}
	}
	if upsertSpan == nil {
		t.Fatal("the server recorded no UpsertTask span")
	}
	if got := upsertSpan.SpanContext().TraceID(); got != producerTrace {
		t.Fatalf("server UpsertTask span in trace %s, want the producer's %s", got, producerTrace)
	}

	// The handler's span: ended, a consumer span of its own trace, linked to
	// the server's UpsertTask span.
	var deliver sdktrace.ReadOnlySpan
	for _, s := range clientSpans.GetSpans().Snapshots() {
		if s.SpanContext().SpanID() == handlerSpan.SpanID() {
			deliver = s
		}
	}
	if deliver == nil {
		t.Fatal("the handler ran in no recorded span")
	}
	if deliver.Name() != "delayd.deliver "+ns || deliver.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("handler span = %q kind %v, want \"delayd.deliver %s\" consumer", deliver.Name(), deliver.SpanKind(), ns)
	}
	if deliver.SpanContext().TraceID() == producerTrace {
		t.Error("handler span continues the producer's trace; want a new trace linked to it")
	}
	links := deliver.Links()
	if len(links) != 1 {
		t.Fatalf("handler span has %d links, want 1", len(links))
	}
	if l := links[0].SpanContext; l.TraceID() != producerTrace || l.SpanID() != upsertSpan.SpanContext().SpanID() {
		t.Errorf("handler span links to %s/%s, want the producer's UpsertTask span %s/%s",
			l.TraceID(), l.SpanID(), producerTrace, upsertSpan.SpanContext().SpanID())
	}
}
