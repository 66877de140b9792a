// Package sessionid is the one definition of a session id's form and of
// the owner it names. A session lives on one worker (its volume, its
// kernel); with worker_id set, the ids that worker generates carry a short
// token of it, so that any worker can tell where a session lives and
// forward a request there (server/README.md, "Session forwarding"):
//
//	se-<owner>-<hex>   owner: Token(worker_id), 8 lower-case hex digits;
//	                   hex: 20 random lower-case hex digits
//	se-<hex>           a worker without worker_id, and every id generated
//	                   before owners existed: no owner, the local worker's
//
// Any other id a client chose (POST /v1/sessions {"id"}) is the local
// worker's too. Every form is within inside.IDRule, which still decides
// what an id may be at all.
package sessionid

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

const (
	prefix = "se-"
	// TokenLen is the length of an owner token in hex digits: 32 bits,
	// so two workers among a few hundred collide with a probability of
	// about 1e-5 (a collision is refused where the peers are listed).
	TokenLen = 8
	randLen  = 20 // hex digits of randomness, as before owners existed
)

// Token is the owner token of the worker named workerID: the first
// TokenLen hex digits of SHA-256(workerID). A node's name is up to 253
// characters and an id at most 64, so the id carries a hash, not the name.
func Token(workerID string) string {
	sum := sha256.Sum256([]byte(workerID))
	return hex.EncodeToString(sum[:])[:TokenLen]
}

// New generates a session id owned by the worker whose token is owner
// ("": an id without an owner).
func New(owner string) string {
	var b [randLen / 2]byte
	rand.Read(b[:])
	if owner == "" {
		return prefix + hex.EncodeToString(b[:])
	}
	return prefix + owner + "-" + hex.EncodeToString(b[:])
}

// Owner returns the owner token an id carries: ok only for the form
// se-<8 lower-case hex>-<rest>, rest not empty. An id that only looks like
// it (a client's choice) is refused at creation unless the token is the
// creating worker's own (session.Manager), so no session is ever stored
// under another worker's token.
func Owner(id string) (token string, ok bool) {
	rest, found := strings.CutPrefix(id, prefix)
	if !found {
		return "", false
	}
	token, rest, found = strings.Cut(rest, "-")
	if !found || rest == "" || !isToken(token) {
		return "", false
	}
	return token, true
}

func isToken(s string) bool {
	if len(s) != TokenLen {
		return false
	}
	for _, c := range []byte(s) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
