package items_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/items"
)

func tokens(n int) []string { return make([]string, n) }

func paths(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "policy.paused"
	}
	return out
}

// TestBothFormsCountAlike: each message, in its wire form and in its JSON
// form, is refused naming the same field, or passes, under a limit of 5.
func TestBothFormsCountAlike(t *testing.T) {
	const limit = 5
	for _, c := range []struct {
		name  string
		msg   proto.Message
		field string // "" when within the limit
	}{
		{"top-level list at the limit", &delaydv1.AckTasksRequest{Tokens: tokens(5)}, ""},
		{"top-level list over", &delaydv1.AckTasksRequest{Tokens: tokens(6)}, "tokens"},
		{"nested lists add up over the message", &delaydv1.StreamDeliveriesRequest{Nacks: []*delaydv1.StreamNack{
			{Tokens: tokens(3)}, {Tokens: tokens(3)},
		}}, "nacks.tokens"},
		{"nested lists within", &delaydv1.StreamDeliveriesRequest{AckTokens: tokens(5), Nacks: []*delaydv1.StreamNack{
			{Tokens: tokens(2)}, {Tokens: tokens(3)},
		}, Extends: []*delaydv1.StreamExtend{{Tokens: tokens(5)}}}, ""},
		{"many small entries", &delaydv1.StreamDeliveriesRequest{Extends: []*delaydv1.StreamExtend{
			{Tokens: tokens(1)}, {Tokens: tokens(1)}, {Tokens: tokens(1)}, {Tokens: tokens(1)}, {Tokens: tokens(1)}, {Tokens: tokens(1)},
		}}, "extends"},
		{"a packed list counts its elements", &delaydv1.CreateKeyRequest{Scopes: []delaydv1.KeyScope{1, 2, 3, 1, 2, 3}}, "scopes"},
		{"a field mask counts its paths", &delaydv1.UpdateNamespaceRequest{UpdateMask: &fieldmaskpb.FieldMask{Paths: paths(6)}}, "update_mask.paths"},
		{"a field mask within", &delaydv1.UpdateNamespaceRequest{UpdateMask: &fieldmaskpb.FieldMask{Paths: paths(5)}}, ""},
		{"a batch's items within", &delaydv1.BatchUpsertTasksRequest{Tasks: []*delaydv1.UpsertTaskRequest{{Id: "a"}, {Id: "b"}}}, ""},
	} {
		wire, err := proto.Marshal(c.msg)
		if err != nil {
			t.Fatal(err)
		}
		text, err := protojson.Marshal(c.msg)
		if err != nil {
			t.Fatal(err)
		}
		md := c.msg.ProtoReflect().Descriptor()
		for form, err := range map[string]error{"wire": items.Wire(wire, md, limit), "JSON": items.JSON(text, md, limit)} {
			checkRefusal(t, c.name+" ("+form+")", err, c.field, limit)
		}
	}
}

func checkRefusal(t *testing.T, name string, err error, field string, limit int) {
	t.Helper()
	var tm *items.TooMany
	switch {
	case field == "" && err != nil:
		t.Errorf("%s: %v; want it within the limit", name, err)
	case field != "" && !errors.As(err, &tm):
		t.Errorf("%s: %v; want TooMany naming %s", name, err, field)
	case field != "" && (tm.Field != field || tm.Limit != limit):
		t.Errorf("%s: TooMany{%s, %d}; want {%s, %d}", name, tm.Field, tm.Limit, field, limit)
	case field != "" && !strings.HasPrefix(err.Error(), fmt.Sprintf("%s has more than %d items", field, limit)):
		t.Errorf("%s: message %q; want it to start with the field and the cap", name, err)
	}
}

// TestJSONForms: the JSON scan follows what protojson accepts (proto
// names, escaped keys, a FieldMask string, strings holding brackets) and
// leaves what it cannot follow to the decoder.
func TestJSONForms(t *testing.T) {
	const limit = 3
	sdr := (&delaydv1.StreamDeliveriesRequest{}).ProtoReflect().Descriptor()
	upd := (&delaydv1.UpdateNamespaceRequest{}).ProtoReflect().Descriptor()
	for _, c := range []struct {
		json  string
		field string
	}{
		{`{"ackTokens": ["a", "b", "c"]}`, ""},
		{`{"ackTokens": ["a", "b", "c", "d"]}`, "ack_tokens"},
		{`{"ack_tokens": ["a", "b", "c", "d"]}`, "ack_tokens"},
		{`{"\u0061ckTokens": ["a", "b", "c", "d"]}`, "ack_tokens"},
		{`{"ackTokens": ["a", "b,c", "d\"]", "e"]}`, "ack_tokens"},
		{`{"ackTokens": ["a", "b,c", "d\"]"]}`, ""},
		{`{"namespace": "[1,2,3,4,5]", "ackTokens": []}`, ""},
		{`{"nacks": [{"tokens": ["a", "b"], "reason": "x]"}, {"retryAfter": "1s", "tokens": ["c", "d"]}]}`, "nacks.tokens"},
		{`{"nacks": [{"tokens": ["a", "b"]}, {"tokens": ["c"]}], "extends": [{"tokens": ["d", "e", "f"]}]}`, ""},
		{`{"unknown": [[1, 2, 3, 4, 5]], "ackTokens": [1, 2, 3]}`, ""},
		{`{"ackTokens": [ ]}`, ""},
		{`[1, 2, 3, 4, 5]`, ""},
		{`{"ackTokens": [` + strings.Repeat(`"x",`, 100), "ack_tokens"},
		{`{"unterminated": "`, ""},
		{`{"ackTokens": [}`, ""},
		{`{"ackTokens": [,,,,,]}`, "ack_tokens"},
	} {
		checkRefusal(t, c.json, items.JSON([]byte(c.json), sdr, limit), c.field, limit)
	}
	for _, c := range []struct {
		json  string
		field string
	}{
		{`{"updateMask": "policy.paused,policy.ackTimeout,policy.maxAttempts"}`, ""},
		{`{"updateMask": "a,b,c,d"}`, "update_mask.paths"},
		{`{"update_mask": "a\u002cb\u002cc\u002cd"}`, "update_mask.paths"},
		{`{"updateMask": ""}`, ""},
		{`{"updateMask": {"paths": ["a", "b", "c", "d"]}}`, "update_mask.paths"},
	} {
		checkRefusal(t, c.json, items.JSON([]byte(c.json), upd, limit), c.field, limit)
	}
}

// FuzzJSONCountsWhatDecodes: whatever JSON text the scan lets through, the
// message protojson decodes from it holds no more items per field than the
// limit (counted on its wire form): no spelling of a request escapes the
// count. The scan never panics, whatever the text.
func FuzzJSONCountsWhatDecodes(f *testing.F) {
	for _, s := range []string{
		`{"ackTokens": ["a", "b", "c", "d"]}`,
		`{"nacks": [{"tokens": ["a", "b"]}, {"tokens": ["c", "d"]}]}`,
		`{"\u0061ckTokens": ["a", "b", "c", "d"]}`,
		`{"extends": [{"tokens": ["a"], "extendBy": "1s"}, {"tokens": ["b", "c", "d"]}], "kinds": ["x"]}`,
		`{"namespace": {"name": "x"}, "updateMask": "a,b,c,d"}`,
		`{"update_mask": "a\u002cb\u002cc\u002cd"}`,
	} {
		f.Add(s)
	}
	const limit = 3
	msgs := []proto.Message{&delaydv1.StreamDeliveriesRequest{}, &delaydv1.UpdateNamespaceRequest{}}
	f.Fuzz(func(t *testing.T, text string) {
		for _, m := range msgs {
			md := m.ProtoReflect().Descriptor()
			if items.JSON([]byte(text), md, limit) != nil {
				continue
			}
			msg := m.ProtoReflect().New().Interface()
			if protojson.Unmarshal([]byte(text), msg) != nil {
				continue
			}
			wire, err := proto.Marshal(msg)
			if err != nil {
				t.Fatal(err)
			}
			if err := items.Wire(wire, md, limit); err != nil {
				t.Errorf("%s as %s: the JSON scan let it through, but the decoded message has %v", text, md.FullName(), err)
			}
		}
	})
}
