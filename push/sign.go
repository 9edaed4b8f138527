package push

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// SignatureHeader is the request header carrying the signature:
//
//	Delayd-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>
//
// where the HMAC is keyed with the namespace's push secret and computed
// over the decimal timestamp, a ".", and the raw request body:
//
//	v1 = hex(HMAC-SHA256(secret, t + "." + body))
//
// A receiver recomputes it over the body it read, compares in constant
// time, and rejects a timestamp further than its tolerance from its own
// clock (DefaultMaxSkew), so a captured request cannot be replayed later.
// Verify does all of that.
const SignatureHeader = "Delayd-Signature"

// DefaultMaxSkew is the tolerance docs/push.md recommends between the
// signature's timestamp and the receiver's clock: requests are signed just
// before they are sent, so it only has to cover clock offset and transit.
const DefaultMaxSkew = 5 * time.Minute

// Sign returns the SignatureHeader value for body signed with secret at t.
func Sign(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, ts, body))
}

func mac(secret []byte, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// Errors of Verify.
var (
	ErrBadSignature = errors.New("push signature does not match")
	ErrStale        = errors.New("push signature timestamp is outside the allowed clock skew")
	ErrMalformed    = errors.New("push signature header is malformed")
)

// Verify checks a SignatureHeader value against body and secret: the
// header must carry t and at least one v1 that matches, and t must be
// within maxSkew of now (maxSkew <= 0: DefaultMaxSkew). Receivers written
// in Go can call it directly; docs/push.md shows the same steps for any
// language.
func Verify(secret []byte, header string, body []byte, now time.Time, maxSkew time.Duration) error {
	if maxSkew <= 0 {
		maxSkew = DefaultMaxSkew
	}
	var ts string
	var sigs [][]byte
	for _, part := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return ErrMalformed
		}
		switch k {
		case "t":
			ts = v
		case "v1":
			sig, err := hex.DecodeString(v)
			if err != nil {
				return ErrMalformed
			}
			sigs = append(sigs, sig)
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 {
		return ErrMalformed
	}
	if d := now.Sub(time.Unix(sec, 0)); d > maxSkew || d < -maxSkew {
		return fmt.Errorf("%w: signed at %s, now %s", ErrStale, time.Unix(sec, 0).UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	want := mac(secret, ts, body)
	for _, sig := range sigs {
		if hmac.Equal(sig, want) {
			return nil
		}
	}
	return ErrBadSignature
}
