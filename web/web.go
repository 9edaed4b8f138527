// Package web is delayd's HTTP edge: it serves the delayd services over the
// Connect protocol (JSON or binary, unary and server streaming), gRPC-Web
// and gRPC (HTTP/2), and the web console at /ui/.
//
// It holds no service code: connectrpc.com/vanguard transcodes every call
// into a gRPC call on the gRPC server's own handler (server.HTTPHandler),
// so the HTTP edge runs the same handlers, interceptors (auth, rate limits,
// quotas), admission codec, message limits and error mapping as the gRPC
// listener. A Connect error carries the same code and message a gRPC client
// gets.
//
// The console (console.go, files in ui/) is static HTML, CSS and JavaScript
// embedded in the binary, with no build step. It holds no secret and no
// privilege of its own: the browser calls the JSON endpoints above with the
// API key a person typed in (kept in the tab's sessionStorage, sent only as
// an Authorization header), so every view shows what that key may see and
// the server decides. Its answers carry a strict Content-Security-Policy
// (ConsoleCSP).
package web

import (
	"errors"
	"fmt"
	"net/http"

	"connectrpc.com/connect"
	"connectrpc.com/vanguard"
	"google.golang.org/protobuf/proto"
)

// Options configure Handler.
type Options struct {
	// GRPC is the gRPC server as an http.Handler (server.HTTPHandler).
	// Required.
	GRPC http.Handler
	// Services are the full names of the services to serve
	// (server.ServiceNames). Required.
	Services []string
	// MaxMessageBytes bounds one message the transcoder buffers, request or
	// response; a larger one fails with ResourceExhausted. Use the gRPC
	// server's limit. Required.
	MaxMessageBytes int
}

// Handler returns the HTTP edge: /ui/ is the web console; every other path
// is a delayd RPC at /<service>/<method> (e.g. POST
// /delayd.v1.TaskService/UpsertTask with Content-Type application/json).
func Handler(opts Options) (http.Handler, error) {
	if opts.GRPC == nil || len(opts.Services) == 0 || opts.MaxMessageBytes <= 0 {
		return nil, errors.New("web: Options.GRPC, Services and MaxMessageBytes are required")
	}
	svcOpts := []vanguard.ServiceOption{
		vanguard.WithTargetProtocols(vanguard.ProtocolGRPC),
		vanguard.WithTargetCodecs(vanguard.CodecProto),
		vanguard.WithMaxMessageBufferBytes(uint32(opts.MaxMessageBytes)),
	}
	services := make([]*vanguard.Service, 0, len(opts.Services))
	for _, name := range opts.Services {
		services = append(services, vanguard.NewService(name, opts.GRPC, svcOpts...))
	}
	tc, err := vanguard.NewTranscoder(services, vanguard.WithCodec(newJSONCodec))
	if err != nil {
		return nil, fmt.Errorf("web: %w", err)
	}
	console, err := consoleHandler()
	if err != nil {
		return nil, fmt.Errorf("web: console: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ui/", console)
	mux.Handle("GET /{$}", http.RedirectHandler("/ui/", http.StatusFound))
	mux.Handle("/", connectByDefault(tc))
	return mux, nil
}

// connectByDefault marks a unary POST without the Connect-Protocol-Version
// header as Connect: the Connect protocol makes the header optional, but
// vanguard reads its absence as a REST call, and delayd has no REST routes.
// So a plain `curl -H 'Content-Type: application/json' -d '{...}'` works.
func connectByDefault(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.Header.Get("Connect-Protocol-Version") == "" {
			switch r.Header.Get("Content-Type") {
			case "application/json", "application/json; charset=utf-8", "application/proto":
				r.Header.Set("Connect-Protocol-Version", "1")
			}
		}
		next.ServeHTTP(w, r)
	})
}

// newJSONCodec is vanguard's JSON codec, refusing unknown fields: a
// misspelled field is an InvalidArgument naming it, not silently dropped.
func newJSONCodec(res vanguard.TypeResolver) vanguard.Codec {
	c := vanguard.NewJSONCodec(res)
	c.UnmarshalOptions.DiscardUnknown = false
	return jsonCodec{c}
}

// jsonCodec answers JSON a client got wrong with InvalidArgument (vanguard
// would answer Unknown).
type jsonCodec struct{ *vanguard.JSONCodec }

func (c jsonCodec) Unmarshal(data []byte, msg proto.Message) error {
	if err := c.JSONCodec.Unmarshal(data, msg); err != nil {
		return connect.NewError(connect.CodeInvalidArgument,
			fmt.Errorf("the request is not a valid %s in JSON: %w", msg.ProtoReflect().Descriptor().FullName(), err))
	}
	return nil
}
