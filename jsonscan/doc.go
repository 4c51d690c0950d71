// Package jsonscan reads JSON objects and arrays in one validating pass,
// handing out their members' raw bytes without decoding them: the fast
// path of request parsing, where bodies are mostly the bytes of long
// prompt strings. It reports false for anything encoding/json would refuse,
// and for anything it is unsure of (nesting past encoding/json's limit, a
// member function that says no); callers then ask encoding/json, which
// decides and words the error. Fuzz tests hold it to that.
package jsonscan
