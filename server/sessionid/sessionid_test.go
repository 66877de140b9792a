package sessionid

import (
	"testing"

	"github.com/sandboxd/sandboxd/nsjail/inside"
)

func TestToken(t *testing.T) {
	// SHA-256("node-a") begins 66570ff0: fixed, so that every worker
	// (and every release) computes the same token for a name.
	if got := Token("node-a"); got != "66570ff0" {
		t.Fatalf("Token(node-a) = %q, want 66570ff0", got)
	}
	if Token("node-a") == Token("node-b") {
		t.Fatal("two names, one token")
	}
}

func TestNewAndOwner(t *testing.T) {
	own := Token("worker-a")
	id := New(own)
	if !inside.ValidID(id) || len(id) != len("se-")+TokenLen+1+randLen {
		t.Fatalf("New(%s) = %q", own, id)
	}
	if tok, ok := Owner(id); !ok || tok != own {
		t.Fatalf("Owner(%q) = %q, %v; want %q", id, tok, ok, own)
	}
	if New(own) == id {
		t.Fatal("two ids alike")
	}
	plain := New("")
	if !inside.ValidID(plain) || len(plain) != len("se-")+randLen {
		t.Fatalf("New(\"\") = %q", plain)
	}
	if tok, ok := Owner(plain); ok {
		t.Fatalf("Owner(%q) = %q: an id without an owner has one", plain, tok)
	}
}

func TestOwnerForms(t *testing.T) {
	for _, c := range []struct {
		id, token string
	}{
		{"se-0123abcd-ff", "0123abcd"},
		{"se-0123abcd-x-y", "0123abcd"},
		{"se-0123abcd9f8e7d6c5b4a", ""}, // the old form: no owner
		{"se-0123abcd-", ""},            // nothing after the token
		{"se-0123ABCD-ff", ""},          // upper case is not a token
		{"se-0123abc-ff", ""},           // 7 digits
		{"se-0123abcde-ff", ""},         // 9 digits
		{"se-0123abcg-ff", ""},          // not hex
		{"0123abcd-ff", ""},             // no prefix
		{"bench", ""},                   // a client's name
		{"", ""},
	} {
		tok, ok := Owner(c.id)
		if tok != c.token || ok != (c.token != "") {
			t.Errorf("Owner(%q) = %q, %v; want %q", c.id, tok, ok, c.token)
		}
	}
}
