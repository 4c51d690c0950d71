package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
)

// FuzzParseRequest checks that any body either parses into a request whose
// model is set and whose bytes are the input's, or is refused with a 400 in
// the OpenAI shape; never a panic.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hi"}`,
		`{"model":"m","prompt":["a","b"],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","prompt":[1,2,3]}`,
		`{"model":"m","prompt":[[1],[2,3]]}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"stream":false}`,
		`{"model":null}`, `[]`, `{`, "\xff", ``, `{"model":"m","stream":"yes"}`,
	} {
		f.Add(uint8(KindCompletion), []byte(s))
		f.Add(uint8(KindChat), []byte(s))
	}
	f.Fuzz(func(t *testing.T, kind uint8, body []byte) {
		k := Kind(kind % 3)
		orig := bytes.Clone(body)
		r, err := ParseRequest(k, body)
		if !bytes.Equal(body, orig) {
			t.Fatal("ParseRequest changed the body")
		}
		if err != nil {
			var he *HTTPError
			if !errors.As(err, &he) || he.Status != http.StatusBadRequest || he.Msg == "" {
				t.Fatalf("error %v is not a 400 with a message", err)
			}
			return
		}
		if r.Model == "" || r.Kind != k || !bytes.Equal(r.Body, orig) {
			t.Fatalf("parsed %+v from %q", r, orig)
		}
		if !json.Valid(body) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		if r.IncludeUsage && !bytes.Contains(body, []byte("include_usage")) {
			t.Fatalf("include_usage from nowhere in %q", body)
		}
	})
}

// TestParseRequestKeysMatchWithCase: keys are matched exactly, as the
// servers behind us match them; encoding/json alone would read "Model" as
// model and "streAm_options" as stream_options (found by FuzzParseRequest).
func TestParseRequestKeysMatchWithCase(t *testing.T) {
	r, err := ParseRequest(KindCompletion, []byte(`{"model":"m","prompt":"p","stream":true,"streAm_options":{"include_usage":true}}`))
	if err != nil || r.IncludeUsage {
		t.Errorf("streAm_options read as stream_options: %+v %v", r, err)
	}
	r, err = ParseRequest(KindCompletion, []byte(`{"model":"m","prompt":"p","stream":true,"stream_options":{"Include_Usage":true}}`))
	if err != nil || r.IncludeUsage {
		t.Errorf("Include_Usage read as include_usage: %+v %v", r, err)
	}
	if _, err := ParseRequest(KindCompletion, []byte(`{"Model":"m","prompt":"p"}`)); err == nil {
		t.Error(`"Model" accepted as the model`)
	}
	r, err = ParseRequest(KindCompletion, []byte(`{"model":"m","prompt":"p","stream":true,"stream_options":{"include_usage":true}}`))
	if err != nil || !r.IncludeUsage {
		t.Errorf("include_usage not read: %+v %v", r, err)
	}
}
