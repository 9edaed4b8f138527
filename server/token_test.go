package server

import (
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/delayd/delayd/storage"
)

func TestTokenRoundTrip(t *testing.T) {
	for _, tok := range []storage.Token{
		{Namespace: "a", ID: "b", Generation: 1, Attempt: 1, Delivery: 1},
		{Namespace: "orders-eu_1", ID: "order.42-x_Y", Incarnation: 1_764_470_000_123_456, Generation: 1 << 40, Attempt: 7, Delivery: 1_764_470_000_124_001},
		{Namespace: strings.Repeat("n", storage.MaxNamespaceLen), ID: strings.Repeat("I", storage.MaxTaskIDLen), Incarnation: math.MaxInt64, Generation: math.MaxInt64, Attempt: math.MaxInt32, Delivery: math.MaxInt64},
	} {
		s := encodeToken(tok)
		if len(s) > maxTokenLen {
			t.Errorf("token for %+v is %d characters, more than maxTokenLen %d", tok, len(s), maxTokenLen)
		}
		got, err := decodeToken(s)
		if err != nil {
			t.Fatalf("decodeToken(encodeToken(%+v)): %v", tok, err)
		}
		if diff := cmp.Diff(tok, got); diff != "" {
			t.Errorf("round trip (-want +got):\n%s", diff)
		}
	}
}

func TestTokenRejectsMalformed(t *testing.T) {
	good := encodeToken(storage.Token{Namespace: "ns", ID: "id", Incarnation: 4, Generation: 3, Attempt: 2, Delivery: 5})
	for name, s := range map[string]string{
		"empty":         "",
		"not base64":    "!!!",
		"padded":        good + "=",
		"truncated":     good[:len(good)-4],
		"other ver":     encodeRaw([]byte{4, 1, 1, 4, 5, 2, 'n', 's', 'i', 'd'}),
		"version 1":     encodeRaw([]byte{1, 3, 2, 2, 'n', 's', 'i', 'd'}),    // the form before incarnations
		"version 2":     encodeRaw([]byte{2, 1, 1, 5, 2, 'n', 's', 'i', 'd'}), // the form before delivery numbers
		"zero gen":      encodeRaw([]byte{3, 0, 1, 4, 5, 2, 'n', 's', 'i', 'd'}),
		"zero attempt":  encodeRaw([]byte{3, 1, 0, 4, 5, 2, 'n', 's', 'i', 'd'}),
		"zero delivery": encodeRaw([]byte{3, 1, 1, 4, 0, 2, 'n', 's', 'i', 'd'}),
		"no delivery":   encodeRaw([]byte{3, 1, 1, 4}),
		"long varint":   encodeRaw([]byte{3, 1, 1, 4, 0x85, 0x00, 2, 'n', 's', 'i', 'd'}),
		"ns too long":   encodeRaw([]byte{3, 1, 1, 4, 5, 9, 'n', 's', 'i', 'd'}),
		"bad ns":        encodeRaw([]byte{3, 1, 1, 4, 5, 2, 'N', 'S', 'i', 'd'}),
		"bad id":        encodeRaw([]byte{3, 1, 1, 4, 5, 2, 'n', 's', 'i', '{'}),
		"no id":         encodeRaw([]byte{3, 1, 1, 4, 5, 2, 'n', 's'}),
		"huge":          strings.Repeat("A", maxTokenLen+1),
	} {
		if tok, err := decodeToken(s); err == nil {
			t.Errorf("%s: decodeToken(%q) = %+v, want an error", name, s, tok)
		}
	}
}

func encodeRaw(b []byte) string {
	return tokenEncoding.EncodeToString(b)
}

// FuzzDecodeToken: any client string either fails to decode or decodes to a
// token with a valid namespace and id that encodes back to the same string.
func FuzzDecodeToken(f *testing.F) {
	f.Add(encodeToken(storage.Token{Namespace: "ns", ID: "id", Incarnation: 1_764_470_000_123_000, Generation: 3, Attempt: 2, Delivery: 1_764_470_000_124_000}))
	f.Add("")
	f.Add("AQEBBGRlbW9vcmRlci00Mg") // version 1: no incarnation
	f.Add(encodeRaw([]byte{3, 1, 1, 4, 0x85, 0x00, 2, 'n', 's', 'i', 'd'}))
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := decodeToken(s)
		if err != nil {
			return
		}
		if storage.ValidateNamespace(tok.Namespace) != nil || storage.ValidateTaskID(tok.ID) != nil ||
			tok.Generation < 1 || tok.Attempt < 1 || tok.Delivery < 1 || tok.Incarnation < 0 {
			t.Fatalf("decodeToken(%q) = %+v: invalid fields accepted", s, tok)
		}
		if again := encodeToken(tok); again != s {
			// Non-canonical varints would let two strings name one
			// delivery; harmless, but keep the form canonical.
			t.Fatalf("decodeToken(%q) = %+v encodes back to %q", s, tok, again)
		}
	})
}
