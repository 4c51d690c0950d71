package proxy

import (
	"strings"
	"testing"
)

func TestResponseIDRoundTrip(t *testing.T) {
	tag := responseTag("http://10.0.0.7:8000")
	if len(tag) != respTagLen || tag != responseTag("http://10.0.0.7:8000") {
		t.Fatalf("tag %q: want %d hex digits, the same every time", tag, respTagLen)
	}
	if tag == responseTag("http://10.0.0.8:8000") {
		t.Fatal("two backends share a tag")
	}
	for _, id := range []string{"resp_0123456789abcdef0123456789abcdef", "resp_x", "r", "resp-with_dashes-AND-CAPS"} {
		client := tagResponseID(id, tag)
		server, got, ok := splitResponseID(client)
		if !ok || server != id || got != tag {
			t.Errorf("split(%q) = %q, %q, %v; want %q, %q", client, server, got, ok, id, tag)
		}
	}
}

func TestSplitResponseIDRefuses(t *testing.T) {
	tag := responseTag("b")
	for _, id := range []string{
		"",
		"resp_abc",                         // no tag: not handed out by llmlb
		"resp_abc." + tag[:15],             // short tag
		"resp_abc." + strings.ToUpper(tag), // not lower-case hex
		"resp_abc:" + tag,                  // wrong separator
		"." + tag,                          // no server id
		"resp/../admin." + tag,             // not an id byte: would change the path
		"resp%2Fx." + tag,
		"resp x." + tag,
		"resp.abc." + tag,
		strings.Repeat("a", maxResponseIDLen) + "." + tag,
	} {
		if s, g, ok := splitResponseID(id); ok {
			t.Errorf("split(%q) = %q, %q, true; want refused", id, s, g)
		}
	}
}

func TestTagResponseIDs(t *testing.T) {
	const tag = "00112233445566ff"
	for _, c := range []struct{ in, want string }{
		{`{"id":"resp_1","object":"response"}`, `{"id":"resp_1.` + tag + `","object":"response"}`},
		{`{"id": "resp_1", "previous_response_id": "resp_0"}`, `{"id": "resp_1.` + tag + `", "previous_response_id": "resp_0.` + tag + `"}`},
		// Output item ids are not response ids.
		{`{"id":"msg_1","type":"message"}`, `{"id":"msg_1","type":"message"}`},
		// Text that mentions an id is text: its quotes are escaped.
		{`{"text":"see \"resp_1\" above"}`, `{"text":"see \"resp_1\" above"}`},
		// An escaped backslash before a real quote: the quote is real.
		{`["a\\","resp_2"]`, `["a\\","resp_2.` + tag + `"]`},
		// Not a whole string of id bytes.
		{`{"t":"resp_1 and more"}`, `{"t":"resp_1 and more"}`},
		{`event: response.created` + "\n" + `data: {"response":{"id":"resp_9"}}` + "\n\n", `event: response.created` + "\n" + `data: {"response":{"id":"resp_9.` + tag + `"}}` + "\n\n"},
		{`"resp_`, `"resp_`},
	} {
		if got := string(tagResponseIDs(nil, []byte(c.in), tag)); got != c.want {
			t.Errorf("tag(%s)\n got %s\nwant %s", c.in, got, c.want)
		}
	}
}

// FuzzResponseID: a client's id never panics the reader, an id it accepts
// is made of id bytes (safe in a URL path), and tagging what the server
// sent back yields an id that reads back to it.
func FuzzResponseID(f *testing.F) {
	tag := responseTag("http://b1")
	f.Add("resp_0123456789abcdef0123456789abcdef." + tag)
	f.Add("resp_x")
	f.Add("." + tag)
	f.Add("resp_\u00e9." + tag)
	f.Fuzz(func(t *testing.T, id string) {
		server, got, ok := splitResponseID(id)
		if !ok {
			return
		}
		for i := 0; i < len(server); i++ {
			if !idByte(server[i]) {
				t.Fatalf("accepted %q with server id %q", id, server)
			}
		}
		if tagResponseID(server, got) != id {
			t.Fatalf("%q does not read back", id)
		}
		line := `{"id":"` + server + `"}`
		out := string(tagResponseIDs(nil, []byte(line), got))
		if strings.HasPrefix(server, "resp_") && out != `{"id":"`+id+`"}` {
			t.Fatalf("tagging %s gave %s", line, out)
		}
	})
}
