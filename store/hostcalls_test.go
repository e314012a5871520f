package store

import (
	"errors"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/abi"
)

func TestCheckHostCall(t *testing.T) {
	ok := RecordHostCallParams{Call: HostCall{Seq: 2, Kind: string(abi.CallKindHTTP), RequestDigest: "sha256:x"}}
	if err := CheckHostCall(ok); err != nil {
		t.Fatalf("CheckHostCall(valid) = %v", err)
	}
	for what, edit := range map[string]func(p *RecordHostCallParams){
		"seq":             func(p *RecordHostCallParams) { p.Call.Seq = 0 },
		"kind":            func(p *RecordHostCallParams) { p.Call.Kind = "ftp" },
		"digest":          func(p *RecordHostCallParams) { p.Call.RequestDigest = "" },
		"status":          func(p *RecordHostCallParams) { p.Call.Status = -1 },
		"duration":        func(p *RecordHostCallParams) { p.Call.DurationMS = -1 },
		"output tokens":   func(p *RecordHostCallParams) { p.Call.OutputTokens = -1 },
		"set-aside < 0":   func(p *RecordHostCallParams) { p.SetAsideFrom = -1 },
		"set-aside > seq": func(p *RecordHostCallParams) { p.SetAsideFrom = 3 },
	} {
		p := ok
		edit(&p)
		if err := CheckHostCall(p); !errors.Is(err, ErrInvalid) {
			t.Errorf("CheckHostCall with a bad %s = %v, want ErrInvalid", what, err)
		}
	}
	for _, from := range []int{1, 2} {
		p := ok
		p.SetAsideFrom = from
		if err := CheckHostCall(p); err != nil {
			t.Errorf("CheckHostCall with SetAsideFrom %d = %v", from, err)
		}
	}
	if err := CheckHostCallSeq(0); !errors.Is(err, ErrInvalid) {
		t.Errorf("CheckHostCallSeq(0) = %v", err)
	}
	if err := HostCallTaken(7, 2); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "event 7") ||
		!strings.Contains(err.Error(), "seq 2") {
		t.Errorf("HostCallTaken = %v", err)
	}
	if err := NoHostCall(7, 2); !errors.Is(err, ErrNotFound) {
		t.Errorf("NoHostCall = %v", err)
	}
}

func TestCheckSecretName(t *testing.T) {
	for _, name := range []string{"a", "A-b_c.d", "0", strings.Repeat("z", MaxSecretNameLen)} {
		if err := CheckSecretName(name); err != nil {
			t.Errorf("CheckSecretName(%q) = %v", name, err)
		}
	}
	for _, name := range []string{"", " ", "a b", "a/b", "é", "a\x00", strings.Repeat("z", MaxSecretNameLen+1)} {
		err := CheckSecretName(name)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "secret name") {
			t.Errorf("CheckSecretName(%q) = %v, want ErrInvalid naming it", name, err)
		}
	}
	if err := CheckSecret("k", nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("CheckSecret with no sealed value = %v", err)
	}
	if err := CheckSecret("k", []byte{0}); err != nil {
		t.Errorf("CheckSecret(valid) = %v", err)
	}
}
