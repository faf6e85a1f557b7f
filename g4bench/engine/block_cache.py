"""Prefix sharing for the paged engine: a radix index over full blocks of token ids, reference
counts, and LRU eviction of unreferenced blocks.

The scheduler owns one `BlockCache` when the engine's KV layout is paged (g4bench/model/paged_kv.py).
Slots only bound how many sequences run at once (the decode batch); KV lives in blocks, so a prefix
computed in any slot is reused by any other, and finished conversations stay cached until their
blocks are needed: resident conversations are bounded by blocks, not by slots.

Index. A node is one FULL block of `block_size` token ids under its parent (the root is the empty
prefix), keyed by (parent, the block's ids as a tuple): lookups hash, then compare ids exactly, so
reuse is token-exact. A node owns the physical "full"-group block holding that block's K/V, and may
own a "window"-group block (sliding layers) too. Only full blocks enter the index, so a shared block
is never written again: a sequence that reuses k blocks writes from position k·bs into its own blocks.

Pools and references. Each group has ids 1..n−1 (0 is the engine's null block) with a reference
count per block (one per running sequence naming it). A block with no references is free, or, if a
node owns it, cached: evictable in LRU order (a full block only once its node has no children, so
a chain is evicted from its tail and an interior node is never orphaned). Evicting a node frees its
window block too; a window block can also be evicted alone (the node then keeps only full KV).

Sliding layers. A running sequence holds only the window blocks its next queries can see (logical
blocks from (L − W + 1) // bs, L = its length) and returns older ones as it advances: registered ones
stay cached, others are freed, so per sequence the window group never holds more than the blocks of
one window plus one chunk (the ring's bound). A shared prefix's sliding state is reused block by
block like the full state: a hit of k blocks is usable only if the window blocks of the blocks
covering positions k·bs − W + 1 .. k·bs − 1 are still cached, else the hit shrinks to the longest k
that has them. The engine sizes the window pools for the running sequences plus `cached_windows`
windows per slot (EngineConfig), so each cached conversation end or shared prefix costs one window.

Protocol (engine thread only): `claim(request_id)` gives a request a slot; `begin(slot, prompt,
max_tokens)` (when its prefill starts, so a prompt admitted while another computes the same prefix
finds it) matches the longest cached prefix, reserves full blocks for the whole request and returns
the reused length (None: not enough blocks yet, try again after a step); `prepare(slot, start, n)`
before every engine call that writes positions start .. start+n−1; `extend(slot, tokens)` after it
(completed blocks enter the index); `release(slot)` when the request ends.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(eq=False)
class Node:
    key: tuple[int, tuple[int, ...]]  # (parent id, block ids)
    id: int
    parent: Node | None
    full: int  # physical block (full group)
    window: int = 0  # physical block (window group); 0: not cached
    children: int = 0


class Pool:
    """Block ids 1..n−1 of one group: reference counts, owners (index nodes) and the LRU of cached
    unreferenced blocks. `evictable(block)` says whether a cached block may go on the LRU."""

    def __init__(self, n: int, evictable: Callable[[int], bool]) -> None:
        self.size = n - 1
        self.free = list(range(n - 1, 0, -1))
        self.refs = [0] * n
        self.owner: dict[int, Node] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()
        self._evictable = evictable

    @property
    def available(self) -> int:
        """Blocks an allocation can get: free, or cached and unreferenced. A sequence references its
        whole chain, so an unreferenced node has no referenced descendant and its whole subtree
        can be evicted, tail first (the LRU holds only the evictable tails at any moment)."""
        return len(self.free) + sum(1 for b in self.owner if self.refs[b] == 0)

    def incref(self, block: int) -> None:
        self.lru.pop(block, None)
        self.refs[block] += 1

    def decref(self, block: int) -> None:
        self.refs[block] -= 1
        assert self.refs[block] >= 0, f"block {block} released twice"
        if self.refs[block] == 0:
            self.settle(block)

    def settle(self, block: int, oldest: bool = False) -> None:
        """An unreferenced block: free it, or (cached) put it on the LRU if it may be evicted."""
        if block not in self.owner:
            self.free.append(block)
        elif self._evictable(block):
            self.lru[block] = None
            if oldest:
                self.lru.move_to_end(block, last=False)

    def alloc(self, evict: Callable[[int], None]) -> int:
        if self.free:
            block = self.free.pop()
        elif self.lru:
            block, _ = self.lru.popitem(last=False)
            evict(block)
        else:
            raise RuntimeError(f"KV block pool exhausted ({self.size} blocks, all referenced)")
        self.refs[block] = 1
        return block


@dataclass
class Seq:
    """One slot's sequence: `tokens` are the ids whose K/V are written at positions 0..len−1."""

    tokens: list[int] = field(default_factory=list)
    owner: int | None = None
    full: list[int] = field(default_factory=list)  # physical full block per logical block (reserved)
    nodes: list[Node] = field(default_factory=list)  # index nodes of blocks 0..len(nodes)−1
    window: dict[int, int] = field(default_factory=dict)  # logical block → window block held


class BlockCache:
    """Slots, block pools and the radix index of one paged engine (see the module docstring)."""

    def __init__(
        self,
        num_slots: int,
        *,
        block_size: int,
        table_len: int,
        full_blocks: int,
        window_blocks: int,
        window: int | None,
        set_table: Callable[[int, str, Sequence[int]], None],
    ) -> None:
        self.slots = [Seq() for _ in range(num_slots)]
        self.bs = block_size
        self.table_len = table_len
        self.window = window if window_blocks else None
        self.set_table = set_table
        self.full = Pool(full_blocks, lambda b: self.full.owner[b].children == 0)
        self.win = Pool(window_blocks, lambda b: True) if self.window else None
        self.index: dict[tuple[int, tuple[int, ...]], Node] = {}
        self._ids = itertools.count(1)
        self.prompt_tokens = 0  # over every begin(): prompt tokens looked up
        self.hit_tokens = 0  # ... and reused

    # ------------------------------------------------------------------ slots
    def idle(self) -> list[int]:
        return [i for i, s in enumerate(self.slots) if s.owner is None]

    def busy(self) -> list[int]:
        return [i for i, s in enumerate(self.slots) if s.owner is not None]

    def claim(self, request_id: int) -> int | None:
        idle = self.idle()
        if not idle:
            return None
        self.slots[idle[0]].owner = request_id
        return idle[0]

    # ------------------------------------------------------------------ lookup and reservation
    def match(self, prompt: Sequence[int]) -> list[Node]:
        """Index nodes of the longest usable cached prefix (whole blocks, leaving ≥ 1 token to compute)."""
        nodes: list[Node] = []
        parent_id = 0
        for j in range((len(prompt) - 1) // self.bs):
            node = self.index.get((parent_id, tuple(prompt[j * self.bs : (j + 1) * self.bs])))
            if node is None:
                break
            nodes.append(node)
            parent_id = node.id
        k = len(nodes)
        while self.window and k and not all(nodes[i].window for i in self._window_range(k * self.bs, k)):
            k -= 1
        return nodes[:k]

    def _window_range(self, length: int, end: int) -> range:
        """Logical blocks whose window KV a sequence of `length` tokens needs, up to block `end`."""
        assert self.window is not None
        return range(max(0, length - self.window + 1) // self.bs, end)

    def begin(self, slot: int, prompt: Sequence[int], max_tokens: int) -> int | None:
        """Start `slot`'s request: reuse the longest cached prefix and reserve full blocks for the
        prompt and max_tokens − 1 fed tokens. Returns the reused length, or None if blocks are short."""
        seq = self.slots[slot]
        assert seq.owner is not None and not seq.full, "begin() on a slot that is not freshly claimed"
        nodes = self.match(prompt)
        k = len(nodes)
        total = min(self.table_len, -(-(len(prompt) + max_tokens - 1) // self.bs))
        reclaimed = sum(1 for n in nodes if self.full.refs[n.full] == 0)
        if self.full.available - reclaimed < total - k:
            return None
        for n in nodes:
            self.full.incref(n.full)
        seq.full = [n.full for n in nodes] + [self.full.alloc(self._evict_node) for _ in range(total - k)]
        seq.nodes = list(nodes)
        seq.tokens = list(prompt[: k * self.bs])
        if self.win is not None:
            for i in self._window_range(k * self.bs, k):
                self.win.incref(nodes[i].window)
                seq.window[i] = nodes[i].window
        self.prompt_tokens += len(prompt)
        self.hit_tokens += k * self.bs
        self._push(slot, full=True)
        return k * self.bs

    def prepare(self, slot: int, start: int, n: int) -> None:
        """Make sure every block that positions start .. start+n−1 of `slot` are written to is held."""
        seq = self.slots[slot]
        if (start + n - 1) // self.bs >= len(seq.full):
            raise RuntimeError(f"slot {slot}: position {start + n - 1} beyond its reserved blocks")
        if self.win is None:
            return
        missing = [j for j in range(start // self.bs, (start + n - 1) // self.bs + 1) if j not in seq.window]
        for j in missing:
            seq.window[j] = self.win.alloc(self._evict_window)
        if missing:
            self._push(slot, full=False)

    def extend(self, slot: int, tokens: Sequence[int]) -> None:
        """Record tokens whose K/V the engine just wrote; index completed blocks, drop old window blocks."""
        seq = self.slots[slot]
        seq.tokens.extend(int(t) for t in tokens)
        changed_full = False
        for j in range(len(seq.nodes), len(seq.tokens) // self.bs):
            changed_full |= self._register(seq, j)
        if self.win is not None:
            lo = self._window_range(len(seq.tokens), 0).start
            old = [j for j in seq.window if j < lo]
            for j in old:
                self.win.decref(seq.window.pop(j))
            if old:
                self._push(slot, full=False)
        if changed_full:
            self._push(slot, full=True)

    def release(self, slot: int, keep: bool = True) -> None:
        """The slot's request ended: drop its references. Indexed blocks stay cached whatever `keep`
        says (they only ever hold K/V that was written), unindexed ones are freed."""
        seq = self.slots[slot]
        for b in seq.full:
            self.full.decref(b)
        if self.win is not None:
            for b in seq.window.values():
                self.win.decref(b)
        self.slots[slot] = Seq()

    # ------------------------------------------------------------------ index upkeep
    def _register(self, seq: Seq, j: int) -> bool:
        """Enter seq's block j into the index; returns True if the sequence switched to an existing
        node's identical block (two sequences computed the same block; the duplicate is freed)."""
        parent = seq.nodes[-1] if seq.nodes else None
        ids = tuple(seq.tokens[j * self.bs : (j + 1) * self.bs])
        key = (parent.id if parent else 0, ids)
        node = self.index.get(key)
        switched = False
        if node is None:
            node = Node(key=key, id=next(self._ids), parent=parent, full=seq.full[j])
            self.index[key] = node
            self.full.owner[node.full] = node
            if parent is not None:
                parent.children += 1  # the parent is referenced by this sequence: not on the LRU
        elif node.full != seq.full[j]:
            self.full.incref(node.full)
            self.full.decref(seq.full[j])
            seq.full[j] = node.full
            switched = True
        if self.win is not None and not node.window and j in seq.window:
            node.window = seq.window[j]
            self.win.owner[node.window] = node
        seq.nodes.append(node)
        return switched

    def _evict_node(self, block: int) -> None:
        node = self.full.owner.pop(block)
        del self.index[node.key]
        if node.window:
            assert self.win is not None  # only a windowed cache gives nodes window blocks
            window = node.window
            self._evict_window(window)
            self.win.lru.pop(window, None)
            self.win.free.append(window)
        if node.parent is not None:
            node.parent.children -= 1
            if node.parent.children == 0 and self.full.refs[node.parent.full] == 0:
                self.full.settle(node.parent.full, oldest=True)

    def _evict_window(self, block: int) -> None:
        assert self.win is not None  # only a windowed cache has window blocks to evict
        node = self.win.owner.pop(block)
        assert self.win.refs[block] == 0, "evicting a referenced window block"
        node.window = 0

    def _push(self, slot: int, full: bool) -> None:
        seq = self.slots[slot]
        if full:
            self.set_table(slot, "full", seq.full)
        else:
            row = [0] * (max(seq.window, default=-1) + 1)
            for j, b in seq.window.items():
                row[j] = b
            self.set_table(slot, "window", row)

    # ------------------------------------------------------------------ metrics
    def stats(self) -> dict[str, float]:
        """Hit rate over prompt tokens and each pool's blocks: used (referenced by a running request),
        cached (held by the index only), free."""
        out = {
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens,
            "hit_rate": self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
        }
        for name, pool in (("full", self.full), ("window", self.win)):
            if pool is None:
                continue
            owned = list(pool.owner)  # one atomic copy: /metrics reads this from another thread
            free = len(pool.free)
            cached = sum(1 for b in owned if pool.refs[b] == 0)
            out[f"{name}_blocks"] = pool.size
            out[f"{name}_blocks_free"] = free
            out[f"{name}_blocks_cached"] = cached
            out[f"{name}_blocks_used"] = pool.size - free - cached
        return out
