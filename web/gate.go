package web

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// MaxMessageFlag is the delayd flag (and DELAYD_ variable) that sets
// Options.MaxMessageBytes, named in the answer to a body over the limit.
const MaxMessageFlag = "--max-message-bytes (DELAYD_MAX_MESSAGE_BYTES)"

// allowedContentTypes says, in an answer, which Content-Types an RPC path
// takes.
const allowedContentTypes = "application/json (Connect JSON, as curl -H 'Content-Type: application/json' -d '{...}' sends), " +
	"application/proto (Connect binary), application/connect+json or application/connect+proto (Connect streaming), " +
	"application/grpc-web[+proto|+json] (gRPC-Web) or application/grpc (gRPC over HTTP/2)"

// rpcMethods is the set of "/<service>/<method>" paths of services.
func rpcMethods(services []string) (map[string]bool, error) {
	paths := map[string]bool{}
	for _, name := range services {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name))
		if err != nil {
			return nil, fmt.Errorf("service %s: %w", name, err)
		}
		sd, ok := d.(protoreflect.ServiceDescriptor)
		if !ok {
			return nil, fmt.Errorf("%s is not a service", name)
		}
		for i := range sd.Methods().Len() {
			paths["/"+name+"/"+string(sd.Methods().Get(i).Name())] = true
		}
	}
	return paths, nil
}

// unaryType reports whether a Content-Type is a Connect unary one, whose
// whole body is one message.
func unaryType(mt string) bool {
	return mt == "application/json" || mt == "application/proto"
}

// knownType reports whether the edge speaks a Content-Type's protocol.
func knownType(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return unaryType(mt) || strings.HasPrefix(mt, "application/connect+") ||
		mt == "application/grpc" || strings.HasPrefix(mt, "application/grpc+") ||
		strings.HasPrefix(mt, "application/grpc-web")
}

// checkContentType answers a POST to an RPC path whose Content-Type the
// edge does not speak (or that has none) with 415 and a Connect JSON error
// naming Content-Type and what is allowed: without it the transcoder takes
// the call for a REST route and answers a bare 404 on a path that exists.
// Other paths (an unknown method, the console) pass through.
func checkContentType(paths map[string]bool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && paths[r.URL.Path] && !knownType(r.Header.Get("Content-Type")) {
			got := r.Header.Get("Content-Type")
			what := fmt.Sprintf("Content-Type %q is not supported", got)
			if got == "" {
				what = "the request has no Content-Type"
			}
			writeError(w, http.StatusUnsupportedMediaType, "invalid_argument",
				fmt.Sprintf("%s on %s: send one of %s", what, r.URL.Path, allowedContentTypes))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// limitBody answers a Connect unary call whose body is over max bytes with
// 413 and a Connect JSON error naming the limit and the flag that sets it
// (the transcoder would answer 429 "max buffer size"). A body of unknown
// length is read here, up to max+1 bytes, as the transcoder would buffer
// it anyway. Runs after admission, so an unauthenticated body is never
// read (admit answers first).
func limitBody(max int, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if r.Method != http.MethodPost || !unaryType(mt) {
			next.ServeHTTP(w, r)
			return
		}
		size := r.ContentLength
		if size < 0 {
			body, err := io.ReadAll(io.LimitReader(r.Body, int64(max)+1))
			if err != nil {
				writeError(w, http.StatusBadRequest, "invalid_argument", "reading the request body: "+err.Error())
				return
			}
			size = int64(len(body))
			r.Body = io.NopCloser(bytes.NewReader(body))
			if size <= int64(max) {
				r.ContentLength = size
			}
		}
		if size > int64(max) {
			// Read the rest (up to drainFactor × max) before answering, so
			// a client that writes the whole body before it reads (curl,
			// Go's net/http) sees this answer, not a reset connection.
			_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, drainFactor*int64(max)))
			w.Header().Set("Connection", "close")
			writeError(w, http.StatusRequestEntityTooLarge, "resource_exhausted", fmt.Sprintf(
				"the request body is over %d bytes, the largest message this server accepts; "+
					"its %s sets it (a payload in JSON is base64, a third larger than its bytes)", max, MaxMessageFlag))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// drainFactor bounds what limitBody reads of a body over the limit, in
// multiples of the limit; a larger body's client sees the connection close.
const drainFactor = 4

// writeError writes a Connect JSON error ({"code", "message"}) with an HTTP
// status of its own.
func writeError(w http.ResponseWriter, httpStatus int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatus)
	_ = json.NewEncoder(w).Encode(map[string]string{"code": code, "message": msg})
}
