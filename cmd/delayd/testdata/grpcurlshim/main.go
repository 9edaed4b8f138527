// Command grpcurlshim stands in for grpcurl in TestReadmeTour: the subset
// of grpcurl's command line the README's tour uses (-plaintext, -d,
// -max-time, -H; list, describe, unary and server-streaming calls), with
// grpcurl's output form (indented JSON, one message after another) and its
// error form, so the tour's shell lines run verbatim without installing
// grpcurl. It knows the delayd and health services from their compiled
// descriptors instead of asking server reflection.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	_ "github.com/delayd/delayd/gen/delayd/v1"
	_ "google.golang.org/grpc/health/grpc_health_v1"
)

type headers []string

func (h *headers) String() string     { return strings.Join(*h, ",") }
func (h *headers) Set(v string) error { *h = append(*h, v); return nil }

func main() {
	fs := flag.NewFlagSet("grpcurl", flag.ExitOnError)
	fs.Bool("plaintext", false, "")
	data := fs.String("d", "", "")
	maxTime := fs.Float64("max-time", 0, "")
	var hs headers
	fs.Var(&hs, "H", "")
	_ = fs.Parse(os.Args[1:])
	args := fs.Args()
	if len(args) < 2 {
		fail("usage: grpcurl [flags] addr (list | describe name | service/method)")
	}
	addr, verb := args[0], args[1]
	switch {
	case verb == "list":
		var names []string
		protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
			for i := 0; i < fd.Services().Len(); i++ {
				names = append(names, string(fd.Services().Get(i).FullName()))
			}
			return true
		})
		sort.Strings(names)
		fmt.Println(strings.Join(names, "\n"))
		return
	case verb == "describe":
		fmt.Printf("%s is a service:\n", args[2])
		return
	}
	svc, method, ok := strings.Cut(verb, "/")
	if !ok {
		fail("unknown verb " + verb)
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		fail("Failed to resolve symbol \"" + svc + "\"")
	}
	md := d.(protoreflect.ServiceDescriptor).Methods().ByName(protoreflect.Name(method))
	if md == nil {
		fail("service " + svc + " does not include a method named " + method)
	}
	req := dynamicpb.NewMessage(md.Input())
	if *data != "" {
		if err := protojson.Unmarshal([]byte(*data), req); err != nil {
			fail("Error invoking method \"" + verb + "\": error getting request data: " + err.Error())
		}
	}
	ctx := context.Background()
	if *maxTime > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(*maxTime*float64(time.Second)))
		defer cancel()
	}
	for _, h := range hs {
		k, v, _ := strings.Cut(h, ":")
		ctx = metadata.AppendToOutgoingContext(ctx, strings.TrimSpace(k), strings.TrimSpace(v))
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail(err.Error())
	}
	defer conn.Close()
	full := "/" + svc + "/" + method
	if !md.IsStreamingServer() {
		resp := dynamicpb.NewMessage(md.Output())
		if err := conn.Invoke(ctx, full, req, resp); err != nil {
			rpcError(err)
		}
		printMsg(resp)
		return
	}
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, full)
	if err != nil {
		rpcError(err)
	}
	if err := st.SendMsg(req); err != nil {
		rpcError(err)
	}
	_ = st.CloseSend()
	for {
		resp := dynamicpb.NewMessage(md.Output())
		if err := st.RecvMsg(resp); err != nil {
			if errors.Is(err, io.EOF) {
				return
			}
			rpcError(err)
		}
		printMsg(resp)
	}
}

// printMsg writes m as grpcurl does: protojson, indented by two spaces.
func printMsg(m proto.Message) {
	b, err := protojson.Marshal(m)
	if err != nil {
		fail(err.Error())
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		fail(err.Error())
	}
	fmt.Println(out.String())
}

func rpcError(err error) {
	s := status.Convert(err)
	fmt.Fprintf(os.Stderr, "ERROR:\n  Code: %s\n  Message: %s\n", s.Code(), s.Message())
	os.Exit(64 + int(s.Code()))
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "Error: "+msg)
	os.Exit(1)
}
