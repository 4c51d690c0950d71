package balancer

// reasonFor names why candidate i of a scored pick won.
func reasonFor(p *Pick, i int) string {
	c := &p.Cands[i]
	if c.LoRA == LoRARunning {
		for j := range p.Cands {
			if p.Cands[j].LoRA != LoRARunning {
				return "lora"
			}
		}
	}
	if c.MatchedBlocks > 0 {
		return "prefix-hit"
	}
	return "least-load"
}
