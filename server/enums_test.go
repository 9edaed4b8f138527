package server

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
		if got := stateToProto(s).String(); got != want {
			t.Errorf("stateToProto(%d %s) = %s, want %s", s, s, got, want)
		}
		if s >= storage.StateScheduled && s <= storage.StateDead {
			if back, err := listState(stateToProto(s)); err != nil || back != s {
				t.Errorf("listState(stateToProto(%s)) = %s, %v", s, back, err)
			}
		}
	}
	for s := storage.ScopeUnspecified; s <= storage.ScopeAdmin+1; s++ {
		want := "KEY_SCOPE_" + strings.ToUpper(s.String())
		got := scopeToProto(s)
		if got.String() != want {
			t.Errorf("scopeToProto(%d %s) = %s, want %s", s, s, got, want)
		}
		back, ok := scopeFromProto(got)
		if wantOK := s >= storage.ScopeProduce && s <= storage.ScopeAdmin; ok != wantOK || (ok && back != s) {
			t.Errorf("scopeFromProto(%s) = %s, %v", got, back, ok)
		}
	}
	if _, ok := scopeFromProto(delaydv1.KeyScope(42)); ok {
		t.Error("scopeFromProto(42) is ok")
	}
	names := map[storage.TokenStatus]string{
		storage.TokenUnspecified: "TOKEN_STATUS_UNSPECIFIED", storage.TokenOK: "TOKEN_STATUS_OK",
		storage.TokenStale: "TOKEN_STATUS_STALE", storage.TokenNotFound: "TOKEN_STATUS_NOT_FOUND",
		storage.TokenNotFound + 1: "TOKEN_STATUS_UNSPECIFIED",
	}
	for s, want := range names {
		if got := tokenStatusToProto(s).String(); got != want {
			t.Errorf("tokenStatusToProto(%d) = %s, want %s", s, got, want)
		}
	}
	for k := storage.EventUnspecified; k <= storage.NumEventKinds; k++ {
		want := "TASK_EVENT_KIND_" + strings.ToUpper(k.String())
		if got := eventKindToProto(k).String(); got != want {
			t.Errorf("eventKindToProto(%d %s) = %s, want %s", k, k, got, want)
		}
	}
}
