package server

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/server/rpcerr"
	"github.com/delayd/delayd/storage"
)

// FuzzValidateAndKeys feeds arbitrary requests through the edge validation:
// nothing panics, every rejection is a *rpcerr.FieldError naming a field, and
// whatever is accepted is safe to become a Redis key (it passes the storage
// name validators) and within the policy's limits. Page tokens round-trip
// and never decode for another namespace or state. (The key builder's own
// fuzz lives in storage/redisstore.)
func FuzzValidateAndKeys(f *testing.F) {
	f.Add("orders", "order-1", "order.close", []byte("x"), int64(30e9), false, int64(0), int32(0), "", "", uint8(1))
	f.Add("a", "A.b_c-9", "", []byte{}, int64(-1), true, int64(1<<40), int32(-5), "b", "eyJ2IjoxfQ", uint8(3))
	f.Add("{ns}", "id}{", "k\x00", []byte(strings.Repeat("p", 70000)), int64(0), true, int64(-62135596800), int32(0), "{ns}", "!!", uint8(9))
	f.Add("ns-", "x:y", "\xff", []byte(nil), int64(1<<62), false, int64(0), int32(1e9), "ns-", strings.Repeat("A", 5000), uint8(0))

	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pol := storage.DefaultPolicy()
	pol.MaxPayloadBytes = 1 << 10

	f.Fuzz(func(t *testing.T, ns, id, kind string, payload []byte, delay int64, useDue bool, dueSec int64, dueNanos int32, batchNS, token string, state uint8) {
		req := &delaydv1.UpsertTaskRequest{Namespace: ns, Id: id, Kind: kind, Payload: payload}
		if useDue {
			req.When = &delaydv1.UpsertTaskRequest_DueTime{DueTime: &timestamppb.Timestamp{Seconds: dueSec, Nanos: dueNanos}}
		} else {
			req.When = &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(time.Duration(delay))}
		}

		if err := validateNamespace("namespace", ns); err == nil {
			if storage.ValidateNamespace(ns) != nil || strings.ContainsAny(ns, "{}:") {
				t.Fatalf("namespace %q accepted but unsafe for a key", ns)
			}
		} else {
			mustNameField(t, err, "namespace")
		}

		prefix := ""
		if batchNS != "" {
			prefix = "tasks[7]."
		}
		spec, err := upsertSpec(prefix, req, batchNS, pol, now)
		if err != nil {
			mustNameField(t, err, prefix)
		} else {
			if err := storage.ValidateTaskID(spec.ID); err != nil || strings.ContainsAny(spec.ID, "{}: ") {
				t.Fatalf("id %q accepted but unsafe for a key", spec.ID)
			}
			if !utf8.ValidString(spec.Kind) || utf8.RuneCountInString(spec.Kind) > maxKindLen ||
				strings.IndexFunc(spec.Kind, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
				t.Fatalf("kind %q accepted", spec.Kind)
			}
			if len(spec.Payload) > pol.MaxPayloadBytes {
				t.Fatalf("payload of %d bytes accepted", len(spec.Payload))
			}
			if spec.Delay < 0 || spec.Delay > pol.MaxDelay {
				t.Fatalf("delay %v accepted", spec.Delay)
			}
			if spec.DueTime.Sub(now) > pol.MaxDelay {
				t.Fatalf("due time %v beyond the horizon accepted", spec.DueTime)
			}
			if batchNS != "" && ns != "" && ns != batchNS {
				t.Fatalf("item namespace %q accepted in batch %q", ns, batchNS)
			}
		}

		st := storage.State(state)
		cursor, err := decodePageToken(token, ns, st)
		if err != nil {
			mustNameField(t, err, "page_token")
		} else if token != "" && cursor == "" {
			t.Fatalf("token %q decoded to an empty cursor", token)
		}
		if kind != "" && storage.ValidateNamespace(ns) == nil { // kind as a cursor: tokens round-trip and stay bound
			tok := encodePageToken(ns, st, kind)
			if got, err := decodePageToken(tok, ns, st); err != nil || got != kind {
				t.Fatalf("round trip of cursor %q: got %q, %v", kind, got, err)
			}
			if _, err := decodePageToken(tok, ns+"x", st); err == nil {
				t.Fatalf("token for %q accepted for %q", ns, ns+"x")
			}
			if _, err := decodePageToken(tok, ns, st+1); err == nil {
				t.Fatalf("token for state %d accepted for state %d", st, st+1)
			}
		}
	})
}

// mustNameField fails t unless err is a *rpcerr.FieldError whose field starts with
// prefix.
func mustNameField(t *testing.T, err error, prefix string) {
	t.Helper()
	var fe *rpcerr.FieldError
	if !errors.As(err, &fe) {
		t.Fatalf("error %v (%T) is not a field error", err, err)
	}
	if fe.Field == "" || !strings.HasPrefix(fe.Field, prefix) || !strings.HasPrefix(fe.Error(), fe.Field+" ") {
		t.Fatalf("error %q does not name a field under %q", fe.Error(), prefix)
	}
}
