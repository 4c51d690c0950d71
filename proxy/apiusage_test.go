package proxy

import (
	"net/http"
	"testing"
)

func TestClientKey(t *testing.T) {
	for _, c := range []struct {
		h    http.Header
		want string
		err  error
	}{
		{http.Header{"Authorization": {"Bearer k1"}}, "k1", nil},
		{http.Header{"X-Api-Key": {"k1"}}, "k1", nil},
		{http.Header{"X-Api-Key": {"k1"}, "Authorization": {"Bearer k1"}}, "k1", nil},
		{http.Header{"X-Api-Key": {"k1"}, "Authorization": {"Bearer k2"}}, "", errKeyInvalid},
		{http.Header{"X-Api-Key": {"k1", "k2"}}, "", errKeyInvalid},
		{http.Header{"X-Api-Key": {"k 1"}}, "", errKeyInvalid},
		{http.Header{"X-Api-Key": {""}}, "", errKeyInvalid},
		{http.Header{}, "", errKeyMissing},
	} {
		got, err := clientKey(c.h)
		if got != c.want || err != c.err {
			t.Errorf("%v: %q, %v; want %q, %v", c.h, got, err, c.want, c.err)
		}
	}
}
