package server

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"math"

	"github.com/delayd/delayd/storage"
)

// A delivery token's wire form is opaque to clients: unpadded base64url of
//
//	version byte (2) | uvarint generation | uvarint attempt |
//	uvarint created | uvarint len(namespace) | namespace | task id
//
// It names the delivery (namespace, task, the task's incarnation — its
// create time in Unix ms —, generation, attempt) and nothing else: no
// secret, no signature. A token is only honoured in its own namespace, and
// the store checks incarnation, generation and attempt against what is in
// flight, so a forged token can at most ack a delivery of a namespace the
// caller may already consume, and a token of a removed task never touches
// a task re-created with the same id. Tokens of version 1 (without the
// incarnation) are rejected as malformed.

const (
	tokenVersion = 2
	// maxTokenLen bounds a token before it is decoded: the longest valid
	// token (63-byte namespace, 128-byte id, four varints) is under 300
	// base64 characters.
	maxTokenLen = 512
)

var errBadToken = errors.New("is not a delivery token this server issued")

// tokenEncoding is the text form of a token's bytes.
var tokenEncoding = base64.RawURLEncoding

// encodeToken returns the wire form of t.
func encodeToken(t storage.Token) string {
	buf := make([]byte, 0, 1+4*binary.MaxVarintLen64+len(t.Namespace)+len(t.ID))
	buf = append(buf, tokenVersion)
	buf = binary.AppendUvarint(buf, uint64(t.Generation))
	buf = binary.AppendUvarint(buf, uint64(t.Attempt))
	buf = binary.AppendUvarint(buf, uint64(t.Created))
	buf = binary.AppendUvarint(buf, uint64(len(t.Namespace)))
	buf = append(buf, t.Namespace...)
	buf = append(buf, t.ID...)
	return tokenEncoding.EncodeToString(buf)
}

// decodeToken parses a token's wire form; only the canonical form that
// encodeToken produces is accepted. The error (errBadToken) is meant
// to follow a field name, e.g. "tokens[3] is not a delivery token ...".
func decodeToken(s string) (storage.Token, error) {
	if s == "" || len(s) > maxTokenLen {
		return storage.Token{}, errBadToken
	}
	b, err := tokenEncoding.DecodeString(s)
	if err != nil || len(b) < 1 || b[0] != tokenVersion {
		return storage.Token{}, errBadToken
	}
	b = b[1:]
	gen, n := binary.Uvarint(b)
	if n <= 0 || gen == 0 || gen > math.MaxInt64 {
		return storage.Token{}, errBadToken
	}
	b = b[n:]
	attempt, n := binary.Uvarint(b)
	if n <= 0 || attempt == 0 || attempt > math.MaxInt32 {
		return storage.Token{}, errBadToken
	}
	b = b[n:]
	// Every task has a create time, so the server never issues 0.
	created, n := binary.Uvarint(b)
	if n <= 0 || created == 0 || created > math.MaxInt64 {
		return storage.Token{}, errBadToken
	}
	b = b[n:]
	nsLen, n := binary.Uvarint(b)
	if n <= 0 || nsLen > uint64(len(b)-n) {
		return storage.Token{}, errBadToken
	}
	b = b[n:]
	t := storage.Token{
		Namespace:  string(b[:nsLen]),
		ID:         string(b[nsLen:]),
		Generation: int64(gen),
		Attempt:    int32(attempt),
		Created:    int64(created),
	}
	if storage.ValidateNamespace(t.Namespace) != nil || storage.ValidateTaskID(t.ID) != nil {
		return storage.Token{}, errBadToken
	}
	// One delivery, one token: reject non-minimal varints and stray base64
	// bits, so no two strings name the same delivery.
	if encodeToken(t) != s {
		return storage.Token{}, errBadToken
	}
	return t, nil
}
