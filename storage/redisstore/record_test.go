package redisstore

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRecordRoundTrip(t *testing.T) {
	for _, r := range []record{
		{gen: 1, inc: 1795999524097123, dseq: 1795999524099000, created: 1795999524097, updated: 1795999524097},
		{gen: 1 << 52, attempt: 1<<31 - 1, created: 1795999524097, updated: 1795999999999, due: -5,
			kind: "k|,", lastErr: "why,|", payload: []byte("|,,\x00\xff")},
		{gen: 3, attempt: 2, created: 10, updated: 5, due: 1795999524097, payload: []byte(strings.Repeat("p", 100))},
		{gen: 3, kind: "k", lastErr: "boom", payload: []byte(strings.Repeat("p", inlineMax))},
		{gen: 3, kind: "k", lastErr: "boom", payload: []byte(strings.Repeat("p", inlineMax+1))},
	} {
		h := r.header()
		if got, want := strings.Count(string(h[:strings.IndexByte(string(h), '|')]), ","), headerFields-1; r.inline() != (got == want+1) {
			t.Errorf("header %q of a %d-byte payload: %d commas, inline %v", h, len(r.payload), got, r.inline())
		}
		got, err := decodeRecord(string(h), string(r.bodyValue()))
		if err != nil {
			t.Fatalf("decode %q: %v", h, err)
		}
		if diff := cmp.Diff(r, got, cmp.AllowUnexported(record{})); diff != "" {
			t.Errorf("round trip of %q (-want +got):\n%s", h, diff)
		}
	}
}

func TestRecordHeaderIsCompact(t *testing.T) {
	// A fresh task: an incarnation, generation 1, attempt 0, never
	// delivered, created now, no kind, no error.
	r := record{inc: 1795999524097123, gen: 1, created: 1795999524097, updated: 1795999524097}
	h := string(r.header())
	if len(h) > 36 {
		t.Errorf("header %q is %d bytes, want at most 36", h, len(h))
	}
	// With a 100-byte payload inline the value stays within 124 bytes,
	// which Redis (3-byte sds header, NUL) keeps in a 128-byte allocation.
	r.payload = []byte(strings.Repeat("p", 100))
	if h := r.header(); len(h) > 124 || r.bodyValue() != nil {
		t.Errorf("inline header of a 100-byte payload is %d bytes (body %q), want at most 124 and no body", len(h), r.bodyValue())
	}
}

func TestDecodeRecordRejectsGarbage(t *testing.T) {
	for _, s := range []string{"", "1,2,3", "1,2,3,4,5,6,7|x", "1,,,,,,,zz|x", "1,,,,,,,-1|", "!,,,,,,,|", "1,,,,,,,2|x",
		"1,,-1,,,,,|", "1,,,,,,,,zz|x", "1,,,,,,,1,5|xy", "1,,,,,,,,-1|x", "1,,,,,,,,,|x"} {
		if _, err := decodeRecord(s, ""); err == nil {
			t.Errorf("decodeRecord(%q) succeeded", s)
		}
	}
}

func TestLegacyRecord(t *testing.T) {
	// gen 2, attempt 1, created, updated +5, due, kind "k", error "e", payload "pay"
	r, err := legacyRecord("2,1,1a2b,5,1a30,1,1|kepay")
	want := record{gen: 2, attempt: 1, created: 0x1a2b, updated: 0x1a2b + 5, due: 0x1a30, kind: "k", lastErr: "e", payload: []byte("pay")}
	if err != nil || !cmp.Equal(r, want, cmp.AllowUnexported(record{})) {
		t.Errorf("legacyRecord = %+v, %v; want %+v", r, err, want)
	}
	for _, s := range []string{"", "1,2|x", "1,,,,,5,5|x"} {
		if _, err := legacyRecord(s); err == nil {
			t.Errorf("legacyRecord(%q) succeeded", s)
		}
	}
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add("lzx4k2ab,1,,,lzx4k2ab,,,1|kerr", "payload")
	f.Add("1,2,3,4,5,6,7,0|", "")
	f.Add("1,2,3,4,5,6,7,1,2|kerpayload", "")
	f.Fuzz(func(t *testing.T, h, payload string) {
		r, err := decodeRecord(h, payload)
		if err != nil {
			return
		}
		// whatever decodes re-encodes to something that decodes the same
		again, err := decodeRecord(string(r.header()), string(r.bodyValue()))
		if err != nil || !cmp.Equal(r, again, cmp.AllowUnexported(record{})) {
			t.Fatalf("re-decode of %q: %+v, %v; want %+v", h, again, err, r)
		}
	})
}
