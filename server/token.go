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
//	version byte (3) | uvarint generation | uvarint attempt |
//	uvarint incarnation | uvarint delivery | uvarint len(namespace) |
//	namespace | task id
//
// It names the delivery (namespace, task, the task's incarnation and
// generation, the delivery's sequence number; the attempt is carried for
// the record) and nothing else: no secret, no signature. A token is only
// honoured in its own namespace, and the store checks incarnation,
// generation and delivery against what is in flight, so a forged token can
// at most ack a delivery of a namespace the caller may already consume; a
// token of a removed task never touches a task re-created with the same id,
// and no two deliveries share a token (not across a requeue, a rebuild of
// the index or a restored Redis snapshot). Tokens of versions 1 and 2 are
// rejected as malformed.

const (
	tokenVersion = 3
	// maxTokenLen bounds a token before it is decoded: the longest valid
	// token (63-byte namespace, 128-byte id, five varints) is under 310
	// base64 characters.
	maxTokenLen = 512
)

var errBadToken = errors.New("is not a delivery token this server issued")

// tokenEncoding is the text form of a token's bytes.
var tokenEncoding = base64.RawURLEncoding

// encodeToken returns the wire form of t.
func encodeToken(t storage.Token) string {
	buf := make([]byte, 0, 1+5*binary.MaxVarintLen64+len(t.Namespace)+len(t.ID))
	buf = append(buf, tokenVersion)
	buf = binary.AppendUvarint(buf, uint64(t.Generation))
	buf = binary.AppendUvarint(buf, uint64(t.Attempt))
	buf = binary.AppendUvarint(buf, uint64(t.Incarnation))
	buf = binary.AppendUvarint(buf, uint64(t.Delivery))
	buf = binary.AppendUvarint(buf, uint64(len(t.Namespace)))
	buf = append(buf, t.Namespace...)
	buf = append(buf, t.ID...)
	return tokenEncoding.EncodeToString(buf)
}

// decodeToken parses a token's wire form; only the canonical form that
// encodeToken produces is accepted. The error is errBadToken (the
// handlers answer it per token, TOKEN_STATUS_MALFORMED).
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
	// Tasks stored before incarnations existed have incarnation 0.
	inc, n := binary.Uvarint(b)
	if n <= 0 || inc > math.MaxInt64 {
		return storage.Token{}, errBadToken
	}
	b = b[n:]
	// Every delivery has a sequence number, so the server never issues 0.
	delivery, n := binary.Uvarint(b)
	if n <= 0 || delivery == 0 || delivery > math.MaxInt64 {
		return storage.Token{}, errBadToken
	}
	b = b[n:]
	nsLen, n := binary.Uvarint(b)
	if n <= 0 || nsLen > uint64(len(b)-n) {
		return storage.Token{}, errBadToken
	}
	b = b[n:]
	t := storage.Token{
		Namespace:   string(b[:nsLen]),
		ID:          string(b[nsLen:]),
		Incarnation: int64(inc),
		Generation:  int64(gen),
		Attempt:     int32(attempt),
		Delivery:    int64(delivery),
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
