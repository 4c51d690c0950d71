package sim

import "slices"

// useAdapter makes name resident on the GPU and reports 1 if that took a
// load.
func (e *Engine) useAdapter(name string) int {
	if name == "" {
		return 0
	}
	if i := slices.Index(e.loaded, name); i >= 0 {
		e.loaded = append(slices.Delete(e.loaded, i, i+1), name)
		return 0
	}
	if len(e.loaded) >= e.cfg.MaxLoRA {
		// Evict the least recently used adapter the batch does not use; the
		// running batch never holds more than MaxLoRA adapters.
		inUse := e.runningAdapters()
		for i, a := range e.loaded {
			if !slices.Contains(inUse, a) {
				e.loaded = slices.Delete(e.loaded, i, i+1)
				break
			}
		}
	}
	e.loaded = append(e.loaded, name)
	return 1
}

func (e *Engine) runningAdapters() []string {
	var out []string
	for _, s := range e.running {
		if s.Adapter != "" && !slices.Contains(out, s.Adapter) {
			out = append(out, s.Adapter)
		}
	}
	return out
}
