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
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/vanguard"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/delayd/delayd/internal/items"
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
	// Admit, if set, authenticates a call from its headers before its body
	// is read (server.AdmitHTTP): an error (a gRPC status) is answered at
	// once, in the call's protocol (401 for Unauthenticated), and the
	// connection is closed after the answer, so a refused client's body is
	// neither read nor decoded.
	Admit func(*http.Request) error
	// MaxRepeatedItems, if above zero, caps the items of every repeated
	// field of a JSON request (tasks, tokens, nacks[].tokens added up, the
	// paths of an update_mask string, ...) as the gRPC edge caps them
	// (server.MaxRepeatedItems, internal/items): more is InvalidArgument
	// naming the field, refused before any item is decoded.
	MaxRepeatedItems int
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
	maxItems := opts.MaxRepeatedItems
	tc, err := vanguard.NewTranscoder(services, vanguard.WithCodec(func(res vanguard.TypeResolver) vanguard.Codec {
		return newJSONCodec(res, maxItems)
	}))
	if err != nil {
		return nil, fmt.Errorf("web: %w", err)
	}
	console, err := consoleHandler()
	if err != nil {
		return nil, fmt.Errorf("web: console: %w", err)
	}
	paths, err := rpcMethods(opts.Services)
	if err != nil {
		return nil, fmt.Errorf("web: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ui/", console)
	mux.Handle("GET /{$}", http.RedirectHandler("/ui/", http.StatusFound))
	// In order: the Content-Type (no body read), the key (no body read),
	// then the body's size, then the call.
	rpc := limitBody(opts.MaxMessageBytes, tc)
	if opts.Admit != nil {
		rpc = admit(opts.Admit, rpc)
	}
	mux.Handle("/", unknownPath(paths, checkContentType(paths, connectByDefault(rpc))))
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

// admit answers a call check refuses before its body is read, in the
// call's protocol, and closes the connection after the answer (HTTP/1.1).
func admit(check func(*http.Request) error, next http.Handler) http.Handler {
	ew := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := check(r)
		if err == nil {
			next.ServeHTTP(w, r)
			return
		}
		st := status.Convert(err)
		w.Header().Set("Connection", "close")
		if ew.IsSupported(r) {
			_ = ew.Write(w, r, connect.NewError(connect.Code(st.Code()), errors.New(st.Message())))
		} else {
			code := http.StatusUnauthorized
			if st.Code() != codes.Unauthenticated {
				code = http.StatusServiceUnavailable
			}
			http.Error(w, st.Message(), code)
		}
		// The body is never read: without a deadline now, net/http would
		// read up to 256 KiB of it, at the client's pace, before closing.
		rc := http.NewResponseController(w)
		_ = rc.Flush()
		_ = rc.SetReadDeadline(time.Now())
	})
}

// newJSONCodec is vanguard's JSON codec, refusing unknown fields (a
// misspelled field is an InvalidArgument naming it, not silently dropped)
// and, with maxItems above zero, a request with more than maxItems items of
// one repeated field at any depth, or FieldMask paths, as the gRPC codec
// counts them (internal/items), before anything is decoded.
func newJSONCodec(res vanguard.TypeResolver, maxItems int) vanguard.Codec {
	c := vanguard.NewJSONCodec(res)
	c.UnmarshalOptions.DiscardUnknown = false
	return jsonCodec{JSONCodec: c, maxItems: maxItems}
}

// jsonCodec answers JSON a client got wrong with InvalidArgument (vanguard
// would answer Unknown).
type jsonCodec struct {
	*vanguard.JSONCodec
	maxItems int
}

func (c jsonCodec) Unmarshal(data []byte, msg proto.Message) error {
	if c.maxItems > 0 {
		if err := items.JSON(data, msg.ProtoReflect().Descriptor(), c.maxItems); err != nil {
			return connect.NewError(connect.CodeInvalidArgument, err)
		}
	}
	if err := c.JSONCodec.Unmarshal(data, msg); err != nil {
		return connect.NewError(connect.CodeInvalidArgument,
			fmt.Errorf("the request is not a valid %s in JSON: %s", msg.ProtoReflect().Descriptor().FullName(), explainJSON(data, err)))
	}
	return nil
}
