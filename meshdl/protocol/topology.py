"""The mesh's static shape: cells, one-hop links, the BFS tree, pooling blocks, halo strips.

Every node derives the same `Topology` from the mesh configuration alone (grid size,
kernel, pool size, where the edge is attached), so messages need not say which cells or
blocks their payload holds: sender and receiver agree on the order by construction.

Cells are (row, col). The edge is `EDGE`; it is linked to the single border cell
`edge_at`, which is the root of the BFS tree that parameters flood down and features
and gradients converge up.

Dead cells (`dead`) take no part: the tree, the pooling leaders, the routes to them and
the halo strips are planned around them. A live cell that only dead ones link to the
edge is cut off and takes no part either; together they are `absent`. A value of
another row whose row-then-column relay crosses an absent cell comes column first
instead (phase 2 strips: up or down its own column, then along the receiver's row), as
the central model with those cells left out would read it. A value neither way can
bring (both cells between a diagonal pair absent) is missing where it is needed (the
node fills it in, meshdl/protocol/deadlines.py); so is a pooling block without a live
member, at the edge. Without dead cells the plan is the full grid's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property

from meshdl.protocol.messages import EDGE

Cell = tuple[int, int]
Block = tuple[int, int]  # (pooled row, pooled col)


def window_offsets(kernel: int) -> tuple[int, int]:
    """Cells (before, after) the centre that a 'same' window reaches: PyTorch's split."""
    before = (kernel - 1) // 2
    return before, kernel - 1 - before


@dataclass(frozen=True)
class Strip:
    """Which cells' values one halo message carries, in payload order."""

    src: Cell
    dst: Cell
    phase: int  # 0: along the row, 1: along the column (carrying row strips)
    cells: tuple[Cell, ...]


@dataclass(frozen=True)
class Topology:
    rows: int
    cols: int
    edge_at: Cell = (0, 0)
    pool: int = 2
    dead: frozenset[Cell] = frozenset()
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        r, c = self.edge_at
        if not (0 <= r < self.rows and 0 <= c < self.cols):
            raise ValueError(
                f"edge_at {self.edge_at} is outside the {self.rows} x {self.cols} grid")
        if r not in (0, self.rows - 1) and c not in (0, self.cols - 1):
            raise ValueError(f"edge_at {self.edge_at} is not a border cell")
        if self.edge_at in self.dead:
            raise ValueError(f"edge_at {self.edge_at} is dead: the edge must attach to "
                             "another cell")

    # ------------------------------------------------------------------ grid
    def cells(self) -> Iterator[Cell]:
        """Every cell in row-major order."""
        for r in range(self.rows):
            for c in range(self.cols):
                yield (r, c)

    def inside(self, cell: Cell) -> bool:
        return 0 <= cell[0] < self.rows and 0 <= cell[1] < self.cols

    def on_border(self, cell: Cell) -> bool:
        """Could the edge be attached here (a cell on the grid's border)?"""
        r, c = cell
        return self.inside(cell) and (r in (0, self.rows - 1) or c in (0, self.cols - 1))

    def neighbours(self, cell: Cell) -> list[Cell]:
        """One-hop links of a cell: grid neighbours up, down, left, right that take part,
        and the edge."""
        r, c = cell
        out = [n for n in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)) if self.inside(n)]
        if self.dead:
            absent = self.absent
            out = [n for n in out if n not in absent]
        return [*out, EDGE] if cell == self.edge_at else out

    @cached_property
    def members(self) -> frozenset[Cell]:
        """The cells that take part: alive and linked to the edge through live ones."""
        return frozenset(self.parent)

    @cached_property
    def absent(self) -> frozenset[Cell]:
        """Dead cells, and live ones cut off from the edge by them."""
        return frozenset(self.cells()) - self.members

    @cached_property
    def cut_off(self) -> frozenset[Cell]:
        """Live cells that only dead ones link to the edge."""
        return self.absent - self.dead

    @property
    def diameter(self) -> int:
        """Hops between the two farthest cells of the grid."""
        return self.rows - 1 + self.cols - 1

    # ------------------------------------------------------------------ tree
    @cached_property
    def parent(self) -> dict[Cell, Cell]:
        """BFS tree from the edge: parent of each cell (edge_at's parent is the edge)."""
        parent: dict[Cell, Cell] = {self.edge_at: EDGE}
        queue = deque([self.edge_at])
        while queue:
            cell = queue.popleft()
            r, c = cell
            for n in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
                if self.inside(n) and n not in self.dead and n not in parent:
                    parent[n] = cell
                    queue.append(n)
        return parent

    @cached_property
    def children(self) -> dict[Cell, list[Cell]]:
        """Tree children of every cell and of the edge, in a fixed order."""
        kids: dict[Cell, list[Cell]] = {cell: [] for cell in self.cells()
                                        if cell in self.parent}
        kids[EDGE] = []
        for cell in self.cells():
            if cell in self.parent:
                kids[self.parent[cell]].append(cell)
        return kids

    @cached_property
    def depth(self) -> dict[Cell, int]:
        """Hops from the edge to each cell (edge_at is 1 hop away)."""
        depth = {EDGE: 0}
        for cell in sorted(self.parent, key=self._bfs_rank.__getitem__):
            depth[cell] = depth[self.parent[cell]] + 1
        return depth

    @cached_property
    def subtree_sizes(self) -> dict[Cell, int]:
        """Cells in each cell's subtree, itself included: what its REDUCE sums."""
        size: dict[Cell, int] = {}
        for cell in sorted(self.parent, key=self._bfs_rank.__getitem__, reverse=True):
            size[cell] = 1 + sum(size[child] for child in self.children.get(cell, []))
        return size

    @cached_property
    def _bfs_rank(self) -> dict[Cell, int]:
        order, queue = [], deque([self.edge_at])
        while queue:
            cell = queue.popleft()
            order.append(cell)
            queue.extend(self.children[cell])
        return {cell: i for i, cell in enumerate(order)}

    # ---------------------------------------------------------------- pooling
    @cached_property
    def pooled_shape(self) -> tuple[int, int]:
        return -(-self.rows // self.pool), -(-self.cols // self.pool)

    def block_of(self, cell: Cell) -> Block:
        return cell[0] // self.pool, cell[1] // self.pool

    def block_cells(self, block: Block) -> list[Cell]:
        """The cells of a pooling window in row-major order (PyTorch's tie order)."""
        p = self.pool
        return [(r, c) for r in range(block[0] * p, min(block[0] * p + p, self.rows))
                for c in range(block[1] * p, min(block[1] * p + p, self.cols))]

    @cached_property
    def leader(self) -> dict[Block, Cell]:
        """Each block's leader: its cell nearest the edge (row-major on ties); a block
        without a member has none."""
        pr, pc = self.pooled_shape
        leaders = {}
        for block in ((i, j) for i in range(pr) for j in range(pc)):
            cells = [c for c in self.block_cells(block) if c in self.parent]
            if cells:
                leaders[block] = min(cells, key=lambda c: (self.depth[c], c))
        return leaders

    @cached_property
    def _led_blocks(self) -> dict[Cell, list[Block]]:
        """The blocks each cell leads, in `leader`'s order (indexed once: scanning every
        block for every cell is quadratic in the grid's size)."""
        led: dict[Cell, list[Block]] = {}
        for block, lead in self.leader.items():
            led.setdefault(lead, []).append(block)
        return led

    def block_parent(self, cell: Cell) -> Cell | None:
        """Next hop from a cell towards its block's leader (column first, then row;
        around absent cells, within the block); None for the leader and for a cell that
        cannot reach it within the block."""
        block = self.block_of(cell)
        if self.absent & set(self.block_cells(block)):
            return self._block_routes(block).get(cell)
        lead = self.leader[block]
        if cell == lead:
            return None
        r, c = cell
        if c != lead[1]:
            return (r, c + (1 if lead[1] > c else -1))
        return (r + (1 if lead[0] > r else -1), c)

    def _block_routes(self, block: Block) -> dict[Cell, Cell | None]:
        """Within a block with absent cells: each member's next hop towards the leader
        (BFS from the leader over the block's members)."""
        key = ("block_routes", block)
        if key not in self._cache:
            lead = self.leader.get(block)
            members = {c for c in self.block_cells(block) if c in self.parent}
            routes: dict[Cell, Cell | None] = {}
            if lead is not None:
                routes[lead] = None
                queue = deque([lead])
                while queue:
                    here = queue.popleft()
                    r, c = here
                    for n in ((r, c - 1), (r, c + 1), (r - 1, c), (r + 1, c)):
                        if n in members and n not in routes:
                            routes[n] = here
                            queue.append(n)
            self._cache[key] = routes
        return self._cache[key]

    def pool_members(self, block: Block) -> list[Cell]:
        """The cells a block's leader pools (row-major): its members that reach it."""
        if not self.absent:
            return self.block_cells(block)
        if not self.absent & set(self.block_cells(block)):
            return self.block_cells(block)
        routes = self._block_routes(block)
        return [c for c in self.block_cells(block) if c in routes]

    @cached_property
    def block_children(self) -> dict[Cell, list[Cell]]:
        kids: dict[Cell, list[Cell]] = {cell: [] for cell in self.members}
        for cell in self.cells():
            up = self.block_parent(cell) if cell in self.parent else None
            if up is not None:
                kids[up].append(cell)
        return kids

    def block_subtree(self, cell: Cell) -> list[Cell]:
        """Cells whose POOL values travel through `cell`: itself first, then each child's."""
        key = ("block_subtree", cell)
        if key not in self._cache:
            out = [cell]
            for child in self.block_children[cell]:
                out.extend(self.block_subtree(child))
            self._cache[key] = out
        return self._cache[key]

    def tree_blocks(self, cell: Cell) -> list[Block]:
        """Blocks led inside the subtree of `cell` (or the edge), in message order:
        the cell's own led blocks first, then each child's, depth first."""
        key = ("tree_blocks", cell)
        if key not in self._cache:
            out = list(self._led_blocks.get(cell, ())) if cell != EDGE else []
            for child in self.children[cell]:
                out.extend(self.tree_blocks(child))
            self._cache[key] = out
        return self._cache[key]

    # ------------------------------------------------------------------- halo
    def window(self, cell: Cell, before: int, after: int) -> list[Cell]:
        """Cells of the window rows/cols [x - before, x + after] that lie in the grid."""
        r, c = cell
        return [(i, j) for i in range(max(0, r - before), min(self.rows, r + after + 1))
                for j in range(max(0, c - before), min(self.cols, c + after + 1))]

    def strips_from(self, cell: Cell, before: int, after: int) -> list[Strip]:
        """The halo messages `cell` sends for windows reaching `before`/`after` cells.

        Phase 0 runs along the row: to the right go the cells the right neighbour's window
        needs from this side ([c+1-before, c]), relayed through each hop; to the left,
        [c, c-1+after]. Phase 1 runs along the column and carries whole row strips
        ([c-before, c+after]), so corners arrive without diagonal links. Every value
        crosses a link only towards a node whose window needs it.
        """
        r, c = cell
        cols_of = [j for j in range(c - before, c + after + 1) if 0 <= j < self.cols]
        out = []
        for dst, lo, hi in (((r, c + 1), c + 1 - before, c), ((r, c - 1), c, c - 1 + after)):
            cells = tuple((r, j) for j in range(max(lo, 0), min(hi, self.cols - 1) + 1))
            if self.inside(dst) and cells:
                out.append(Strip(cell, dst, 0, cells))
        for dst, lo, hi in (((r + 1, c), r + 1 - before, r), ((r - 1, c), r, r - 1 + after)):
            rows = range(max(lo, 0), min(hi, self.rows - 1) + 1)
            cells = tuple((i, j) for i in rows for j in cols_of)
            if self.inside(dst) and cells:
                out.append(Strip(cell, dst, 1, cells))
        if not self.dead:
            return out
        # Around absent cells: only to members, and only what the sender can know.
        known = [Strip(s.src, s.dst, s.phase, tuple(x for x in s.cells if self.knows(cell, x)))
                 for s in out if s.dst in self.parent]
        return [s for s in known if s.cells] + self._detours_from(cell, before, after)

    def _detours_from(self, cell: Cell, before: int, after: int) -> list[Strip]:
        """Phase 2, around absent cells: values from another row that a row neighbour's
        window needs and cannot have by the row-then-column relays (their column
        neighbour is absent), sent column first: along the column (phase 1), then
        along the row (phase 2, relayed as phase 0 is)."""
        r, c = cell
        out = []
        for step in (1, -1):
            dst = (r, c + step)
            if dst not in self.parent:
                continue
            cells = tuple(sorted(x for x in self._detour_candidates(cell, step, before, after)
                                 if not self.knows(dst, x) and
                                 self._detour_needed(dst, x, step, before, after)))
            if cells:
                out.append(Strip(cell, dst, 2, cells))
        return out

    def _detour_candidates(self, cell: Cell, step: int, before: int, after: int
                           ) -> list[Cell]:
        """Cells of other rows that `cell` holds by its column (or by detours from the
        other side), in columns at or behind it as seen from direction `step`."""
        r, c = cell
        reach = max(before, after)
        return [x for x in self.window(cell, reach, reach)
                if x[0] != r and (x[1] - c) * step <= 0 and self._holds(cell, x, step)]

    def _holds(self, cell: Cell, item: Cell, step: int) -> bool:
        """Does `cell` have `item` by the relays or by detours coming from direction
        -`step` along its row?"""
        if cell not in self.parent:
            return False
        if self.knows(cell, item):
            return True
        back = (cell[0], cell[1] - step)
        return (item[1] - back[1]) * step <= 0 and self._holds(back, item, step)

    def _detour_needed(self, dst: Cell, item: Cell, step: int, before: int,
                       after: int) -> bool:
        """Does `dst`, or a member beyond it along the row that only `dst` can pass
        `item` to, need `item` in its window?"""
        here = dst
        while here in self.parent and not self.knows(here, item):
            r, c = here
            if r - before <= item[0] <= r + after and c - before <= item[1] <= c + after:
                return True
            here = (r, c + step)
        return False

    def knows(self, holder: Cell, item: Cell) -> bool:
        """Can `holder` have `item`'s values by the halo relays? Along its row when every
        cell between them takes part (phase 0); from another row when its column
        neighbour towards that row knows it (phase 1, row strips relayed down or up
        the column)."""
        if holder not in self.parent or item not in self.parent:
            return False
        (r, c), (i, j) = holder, item
        if i == r:
            return all((r, x) in self.parent for x in range(min(c, j), max(c, j) + 1))
        towards = (r + (1 if i > r else -1), c)
        return self.knows(towards, item)
