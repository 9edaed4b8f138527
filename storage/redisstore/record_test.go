package redisstore

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRecordRoundTrip(t *testing.T) {
	for _, r := range []record{
		{gen: 1, created: 1795999524097, updated: 1795999524097},
		{gen: 1 << 52, attempt: 1<<31 - 1, created: 1795999524097, updated: 1795999999999, due: -5,
			kind: "k|,", lastErr: "why,|", payload: []byte("|,,\x00\xff")},
		{gen: 3, attempt: 2, created: 10, updated: 5, due: 1795999524097, payload: []byte(strings.Repeat("p", 100))},
	} {
		enc := r.encode()
		got, err := decodeRecord(string(enc))
		if err != nil {
			t.Fatalf("decode %q: %v", enc, err)
		}
		if diff := cmp.Diff(r, got, cmp.AllowUnexported(record{})); diff != "" {
			t.Errorf("round trip of %q (-want +got):\n%s", enc, diff)
		}
	}
}

func TestRecordHeaderIsCompact(t *testing.T) {
	// A fresh task: generation 1, attempt 0, created now, no kind, no error.
	r := record{gen: 1, created: 1795999524097, updated: 1795999524097, payload: []byte("x")}
	enc := string(r.encode())
	if head, _, _ := strings.Cut(enc, "|"); len(head) > 20 {
		t.Errorf("header %q is %d bytes, want at most 20", head, len(head))
	}
}

func TestDecodeRecordRejectsGarbage(t *testing.T) {
	for _, s := range []string{"", "1,2,3", "1,2,3,4,5,6|x", "1,,,,,zz,|x", "1,,,,,,-1|", "!,,,,,,|", "1,,,,,1,1|x"} {
		if _, err := decodeRecord(s); err == nil {
			t.Errorf("decodeRecord(%q) succeeded", s)
		}
	}
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add("1,,lzx4k2ab,,,1,2|kerrpayload")
	f.Add("1,2,3,4,5,6,7|")
	f.Fuzz(func(t *testing.T, s string) {
		r, err := decodeRecord(s)
		if err != nil {
			return
		}
		// whatever decodes re-encodes to something that decodes the same
		again, err := decodeRecord(string(r.encode()))
		if err != nil || !cmp.Equal(r, again, cmp.AllowUnexported(record{})) {
			t.Fatalf("re-decode of %q: %+v, %v; want %+v", s, again, err, r)
		}
	})
}
