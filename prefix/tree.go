package prefix

import (
	"slices"
	"sync"
)

// Tree is a character radix tree of prompts shared by several tenants (the
// balancer's backend slots), as SGLang's cache-aware router keeps one: each
// node records which tenants were sent a prompt passing through it and
// when, so a lookup tells how many leading bytes of a prompt each tenant was
// sent before. A tenant's size is the bytes of tree it holds; past the
// limit, its least recently used leaves are evicted. Safe for concurrent
// use.
type Tree struct {
	maxBytes int // per tenant; 0 means no limit

	mu    sync.RWMutex
	root  *treeNode // guarded by mu
	sizes []int     // guarded by mu; by slot, bytes held
	tick  int64     // guarded by mu; logical clock for recency
}

type treeNode struct {
	label    []byte
	parent   *treeNode
	children map[byte]*treeNode
	tenants  map[int32]int64 // slot → last insert tick
}

// NewTree returns an empty tree evicting a tenant's least recently used
// leaves once it holds more than maxBytes bytes (0: never).
func NewTree(maxBytes int) *Tree {
	return &Tree{maxBytes: maxBytes, root: &treeNode{children: map[byte]*treeNode{}, tenants: map[int32]int64{}}}
}

// Match sets dst[slot] to the number of leading bytes of text that slot was
// sent, for every slot that shares at least one, and returns the longest.
// dst must be zero where it is read; slots beyond len(dst) are not counted.
func (t *Tree) Match(text []byte, dst []int32) int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	n, depth := t.root, 0
	for depth < len(text) {
		c := n.children[text[depth]]
		if c == nil {
			break
		}
		k := commonPrefix(c.label, text[depth:])
		depth += k
		for s := range c.tenants {
			if int(s) < len(dst) {
				dst[s] = int32(depth)
			}
		}
		if k < len(c.label) {
			break
		}
		n = c
	}
	return depth
}

// Size returns the bytes of tree slot holds.
func (t *Tree) Size(slot int) int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if slot < 0 || slot >= len(t.sizes) {
		return 0
	}
	return t.sizes[slot]
}

// Insert records that slot was sent text, then evicts slot's oldest leaves
// while it holds more than the limit.
func (t *Tree) Insert(slot int, text []byte) {
	if slot < 0 || len(text) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.sizes) <= slot {
		t.sizes = append(t.sizes, 0)
	}
	t.tick++
	s := int32(slot)
	n, depth := t.root, 0
	for depth < len(text) {
		c := n.children[text[depth]]
		if c == nil {
			leaf := &treeNode{label: slices.Clone(text[depth:]), parent: n, children: map[byte]*treeNode{}, tenants: map[int32]int64{s: t.tick}}
			n.children[text[depth]] = leaf
			t.sizes[slot] += len(leaf.label)
			break
		}
		k := commonPrefix(c.label, text[depth:])
		if k < len(c.label) {
			c = t.splitLocked(c, k)
		}
		if _, ok := c.tenants[s]; !ok {
			t.sizes[slot] += len(c.label)
		}
		c.tenants[s] = t.tick
		depth += k
		n = c
	}
	if t.maxBytes > 0 && t.sizes[slot] > t.maxBytes {
		t.evictLocked(s)
	}
}

// splitLocked cuts c after k bytes of its label and returns the new upper
// node, which keeps c's tenants. A tenant's size does not change: the same
// bytes are held, in two nodes.
func (t *Tree) splitLocked(c *treeNode, k int) *treeNode {
	upper := &treeNode{label: c.label[:k:k], parent: c.parent, children: map[byte]*treeNode{}, tenants: make(map[int32]int64, len(c.tenants))}
	for s, at := range c.tenants {
		upper.tenants[s] = at
	}
	c.parent.children[upper.label[0]] = upper
	c.label = c.label[k:]
	c.parent = upper
	upper.children[c.label[0]] = c
	return upper
}

// Forget removes slot from every node.
func (t *Tree) Forget(slot int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := int32(slot)
	var walk func(n *treeNode)
	walk = func(n *treeNode) {
		for b, c := range n.children {
			walk(c)
			delete(c.tenants, s)
			if len(c.tenants) == 0 && len(c.children) == 0 {
				delete(n.children, b)
			}
		}
	}
	walk(t.root)
	if slot < len(t.sizes) {
		t.sizes[slot] = 0
	}
}

// evictLocked drops slot from its least recently inserted leaves (nodes it
// holds none of whose children it holds) until it holds at most 90% of the
// limit, pruning nodes no tenant holds. Caller must hold t.mu.
func (t *Tree) evictLocked(s int32) {
	target := t.maxBytes / 10 * 9
	for t.sizes[s] > target {
		var leaves []*treeNode
		var walk func(n *treeNode)
		walk = func(n *treeNode) {
			for _, c := range n.children {
				if _, ok := c.tenants[s]; !ok {
					continue
				}
				before := len(leaves)
				walk(c)
				if len(leaves) == before && !holdsChild(c, s) {
					leaves = append(leaves, c)
				}
			}
		}
		walk(t.root)
		if len(leaves) == 0 {
			return
		}
		slices.SortFunc(leaves, func(a, b *treeNode) int { return int(a.tenants[s] - b.tenants[s]) })
		for _, n := range leaves {
			if t.sizes[s] <= target {
				return
			}
			delete(n.tenants, s)
			t.sizes[s] -= len(n.label)
			if len(n.tenants) == 0 && len(n.children) == 0 {
				delete(n.parent.children, n.label[0])
			}
		}
	}
}

func holdsChild(n *treeNode, s int32) bool {
	for _, c := range n.children {
		if _, ok := c.tenants[s]; ok {
			return true
		}
	}
	return false
}

func commonPrefix(a, b []byte) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
