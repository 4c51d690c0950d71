package scrape

import (
	"slices"
	"strings"
	"testing"
)

// FuzzParseModelList: any body gives an error or sorted lists with no empty
// names; never a panic.
func FuzzParseModelList(f *testing.F) {
	for _, s := range []string{
		`{"object":"list","data":[{"id":"m","object":"model","parent":null,"max_model_len":8192},{"id":"sql-lora","parent":"m","root":"/adapters/sql"}]}`,
		`{"data":[]}`, `{"data":null}`, `{}`, `[]`, `null`, `{"data":[{"id":1}]}`, "",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		sv, err := parseModelList(strings.NewReader(string(body)))
		if err != nil {
			return
		}
		models, adapters := sv.models, sv.adapters
		if models == nil || !slices.IsSorted(models) || slices.Contains(models, "") {
			t.Fatalf("models %q", models)
		}
		for i, a := range adapters {
			if a.Name == "" || a.Parent == "" || (i > 0 && adapters[i-1].Name > a.Name) {
				t.Fatalf("adapters %v", adapters)
			}
		}
	})
}
