"""A fused first layer at 17 x 25 (global head: k 3, 16 filters, reading + alive mask):
today's two halo exchanges (conv1 on readings, conv2 on conv1's outputs) against one
2-hop exchange of readings, each node computing conv1 at its 3 x 3 neighbourhood and
conv2 at its cell. Counted from the plan (`Topology.strips_from`), compact headers."""
from meshdl.config import ModelConfig
from meshdl.protocol.compact import COMPACT_HEADER_BYTES as H
from meshdl.protocol.spec import MeshSpec

cfg = ModelConfig(rows=17, cols=25, filters=16, alive=True, pool="global")
spec = MeshSpec(1, cfg, header="compact", activations="int8-static")
topo = spec.topology
c_in, h = cfg.in_channels, cfg.filters
cells = [c for c in topo.cells() if c in topo.members]
def count(before, after):
    msgs = items = 0
    busiest = 0
    for cell in cells:
        strips = list(topo.strips_from(cell, before, after))
        msgs += len(strips)
        items += sum(len(s.cells) for s in strips)
        busiest = max(busiest, len(strips))
    return msgs, items, busiest
m1, i1, b1 = count(1, 1)  # one layer's 3 x 3 halo
m2, i2, b2 = count(2, 2)  # the 5 x 5 window's 2-hop halo
for name, per in (("float32", (4 * c_in, 4 * h)), ("int8-static", (2 * c_in, 1 * h))):
    today_bytes = m1 * H + i1 * per[0] + m1 * H + i1 * per[1]
    fused_bytes = m2 * H + i2 * per[0]
    print(f"{name}: today conv1+conv2 halos {2 * m1} messages, {today_bytes} B "
          f"({i1} cells x {per[0]} B + {i1} cells x {per[1]} B + headers); "
          f"fused {m2} messages, {fused_bytes} B ({i2} cells x {per[0]} B + headers); "
          f"saves {2 * m1 - m2} messages, {today_bytes - fused_bytes} B a slot "
          f"({(today_bytes - fused_bytes) / len(cells):.1f} B a node)")
print(f"per node at most: today {2 * b1} messages, fused {b2}; conv1 MACs per node: "
      f"today {h * c_in * 9}, fused {9 * h * c_in * 9}")

print("\nOn the shared radio (a broadcast a phase: every strip a node sends in one phase in one "
      "transmission, the union of their cells, heard by every neighbour):")
def air(before, after):
    tx = items = 0
    for cell in cells:
        by_phase = {}
        for s in topo.strips_from(cell, before, after):
            by_phase.setdefault(s.phase, set()).update(s.cells)
        tx += len(by_phase)
        items += sum(len(v) for v in by_phase.values())
    return tx, items
t1, j1 = air(1, 1)
t2, j2 = air(2, 2)
for name, per in (("float32", (4 * c_in, 4 * h)), ("int8-static", (2 * c_in, 1 * h))):
    today = 2 * t1 * H + j1 * per[0] + j1 * per[1]
    fused = t2 * H + j2 * per[0]
    print(f"{name}: today {2 * t1} transmissions, {today} B (conv1 {t1 * H + j1 * per[0]}, "
          f"conv2 {t1 * H + j1 * per[1]}); fused {t2} transmissions, {fused} B; saves "
          f"{2 * t1 - t2} transmissions, {today - fused} B a slot "
          f"({(today - fused) / len(cells):.1f} B a node)")
