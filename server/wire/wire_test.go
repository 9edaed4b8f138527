package wire

import (
	"strings"
	"testing"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/storage"
)

// TestEnumConversions: every storage value maps to the wire value of the
// same name, and back; a value without a counterpart maps to UNSPECIFIED.
// A new storage value that the conversions forget fails here.
func TestEnumConversions(t *testing.T) {
	for s := storage.StateUnspecified; s <= storage.StateDead+1; s++ {
		want := "TASK_STATE_" + strings.ToUpper(s.String())
		if got := State(s).String(); got != want {
			t.Errorf("State(%d %s) = %s, want %s", s, s, got, want)
		}
	}
	for s := storage.ScopeUnspecified; s <= storage.ScopeAdmin+1; s++ {
		want := "KEY_SCOPE_" + strings.ToUpper(s.String())
		got := Scope(s)
		if got.String() != want {
			t.Errorf("Scope(%d %s) = %s, want %s", s, s, got, want)
		}
		back, ok := ScopeFrom(got)
		if wantOK := s >= storage.ScopeProduce && s <= storage.ScopeAdmin; ok != wantOK || (ok && back != s) {
			t.Errorf("ScopeFrom(%s) = %s, %v", got, back, ok)
		}
	}
	if _, ok := ScopeFrom(delaydv1.KeyScope(42)); ok {
		t.Error("ScopeFrom(42) is ok")
	}
	names := map[storage.TokenStatus]string{
		storage.TokenUnspecified: "TOKEN_STATUS_UNSPECIFIED", storage.TokenOK: "TOKEN_STATUS_OK",
		storage.TokenStale: "TOKEN_STATUS_STALE", storage.TokenNotFound: "TOKEN_STATUS_NOT_FOUND",
		storage.TokenNotFound + 1: "TOKEN_STATUS_UNSPECIFIED",
	}
	for s, want := range names {
		if got := TokenStatus(s).String(); got != want {
			t.Errorf("TokenStatus(%d) = %s, want %s", s, got, want)
		}
	}
	for k := storage.EventUnspecified; k <= storage.NumEventKinds; k++ {
		want := "TASK_EVENT_KIND_" + strings.ToUpper(k.String())
		if got := EventKind(k).String(); got != want {
			t.Errorf("EventKind(%d %s) = %s, want %s", k, k, got, want)
		}
	}
}
