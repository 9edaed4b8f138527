package web

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"os"
	"slices"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/delayd/delayd/internal/suggest"
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
// (the transcoder would answer 429 "max buffer size"). A body within the
// limit is read here whole (up to max+1 bytes when its length is unknown),
// as the transcoder would buffer it anyway, so that a body that does not
// arrive in time (the edge's body deadline, server.Limits.HTTPBodyTimeout)
// is answered 408 saying so, and a body that breaks off 400, instead of
// the transcoder's answer to a failed read. Runs after admission, so an
// unauthenticated body is never read (admit answers first).
func limitBody(max int, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if r.Method != http.MethodPost || !unaryType(mt) {
			next.ServeHTTP(w, r)
			return
		}
		size := r.ContentLength
		if size <= int64(max) {
			var body []byte
			var err error
			if size >= 0 { // one allocation of the length announced
				body = make([]byte, size)
				_, err = io.ReadFull(r.Body, body)
			} else {
				body, err = io.ReadAll(io.LimitReader(r.Body, int64(max)+1))
			}
			if err != nil {
				bodyReadError(w, err)
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

// bodyReadError answers a unary call whose body could not be read: 408
// when the body did not arrive before the edge's deadline (the error, the
// server's, says which), 400 otherwise.
func bodyReadError(w http.ResponseWriter, err error) {
	w.Header().Set("Connection", "close")
	if errors.Is(err, os.ErrDeadlineExceeded) {
		writeError(w, http.StatusRequestTimeout, "deadline_exceeded", err.Error())
		return
	}
	writeError(w, http.StatusBadRequest, "invalid_argument", "reading the request body: "+err.Error())
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

// unknownPath answers a request for a path that is neither an RPC nor the
// console with 404 and a Connect JSON error (code unimplemented, as a gRPC
// client gets for an unknown method) that names the path, the method it
// probably meant, how the API's paths are made, and every one of them
// ("paths"); the transcoder would answer a bare "Not Found". gRPC calls
// (Content-Type application/grpc…) pass through: their clients read a
// gRPC status, not a body.
func unknownPath(paths map[string]bool, next http.Handler) http.Handler {
	sorted := slices.Sorted(maps.Keys(paths))
	services := map[string]bool{}
	for _, p := range sorted {
		services[strings.Split(p, "/")[1]] = true
	}
	api := fmt.Sprintf("delayd's HTTP API is POST /<service>/<method> (Connect JSON: Content-Type application/json, "+
		"the body the method's request in JSON), for the services %s (their methods are in \"paths\"; "+
		"grpcurl describe and proto/delayd/v1 document them); the web console is at /ui/",
		strings.Join(slices.Sorted(maps.Keys(services)), ", "))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if paths[r.URL.Path] || mt == "application/grpc" || strings.HasPrefix(mt, "application/grpc+") {
			next.ServeHTTP(w, r)
			return
		}
		msg := "no such path " + r.URL.Path
		if meant := meantPath(r.URL.Path, sorted); meant != "" {
			msg += " (did you mean " + meant + "?)"
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false) // <service> stays readable in curl
		_ = enc.Encode(struct {
			Code    string   `json:"code"`
			Message string   `json:"message"`
			Paths   []string `json:"paths"`
		}{"unimplemented", msg + ": " + api, sorted})
	})
}

// meantPath is the RPC path a wrong one probably meant: the one path whose
// method has the same name (/TaskService/UpsertTask, the package left
// out), else the closest by spelling; "" when none is near.
func meantPath(path string, paths []string) string {
	method := path[strings.LastIndexByte(path, '/')+1:]
	var same []string
	for _, p := range paths {
		if strings.HasSuffix(p, "/"+method) {
			same = append(same, p)
		}
	}
	if len(same) == 1 {
		return same[0]
	}
	if meant, near := suggest.Closest(path, paths); near {
		return meant
	}
	return ""
}
