"""The sensor node as a sans-I/O state machine: `handle(message, now) -> messages to send`.

A node holds its own readings (one value per sample and input channel) and nothing
else. Per wave it:
  1. takes PARAMS and BATCH from its tree parent and forwards them to its children;
  2. for each conv layer, exchanges halo strips with its one-hop neighbours and computes
     its cell's output as soon as its window is complete;
  3. sends its last conv output towards its pooling block's leader; a leader pools its
     block and the pooled features converge up the BFS tree to the edge;
  4. (training) routes d(loss)/d(pooled) back down to each block's max positions,
     exchanges output gradients for each layer's transposed convolution, computes its
     partial filter gradients and adds its children's on the way up (REDUCE).
Every send and computation is a *task* that waits for a list of items (cells' or
blocks' values); when the last one arrives the task runs. No sockets, clocks or asyncio:
transports call `handle`; `now` only stamps when each stage finished. Bad messages are
counted in `stats` and dropped; they never raise.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from typing import NamedTuple

import numpy as np

from meshdl.messages import FLOAT32, INT32, Kind, Message, make
from meshdl.protocol import Field, MeshSpec, Mode, Send
from meshdl.topology import Cell

Item = tuple[Field, Hashable]


def _stack(arrays: list[np.ndarray]) -> np.ndarray:
    """np.stack for equal-shaped arrays, without its per-call overhead (a hot path)."""
    if len(arrays) == 1:
        return arrays[0][None]
    out = np.empty((len(arrays), *arrays[0].shape), arrays[0].dtype)
    for i, a in enumerate(arrays):
        out[i] = a
    return out


class Expect(NamedTuple):
    """A message this node's plan receives, keyed by (kind, layer, phase, source)."""

    role: int  # PARAMS, BATCH, REDUCE or ITEMS: how `NodeMachine._accept` takes it
    keys: tuple[Item, ...] = ()  # ITEMS: (field, item) of each payload row
    channels: int = 0  # ITEMS: a row is (channels, batch)
    train_only: bool = False


# Expect roles, plain ints: the kind of a message is checked once per message, by lookup.
PARAMS, BATCH, REDUCE, ITEMS = range(4)


class NodePlan:
    """A node's tasks and the items each waits for; built once, shared by all waves."""

    def __init__(self, spec: MeshSpec, cell: Cell) -> None:
        topo, layers = spec.topology, spec.model.conv_layers
        before, after = spec.offsets
        block = topo.block_of(cell)
        leads = topo.leader[block] == cell
        # (task, needs, train only): computations, then sends, in a fixed order. A
        # computation is (step, layer, stage name); `NodeMachine` maps steps to methods.
        tasks: list[tuple[tuple[str, int, str] | Send, list[Item], bool]] = []
        for layer in range(1, layers + 1):
            window = topo.window(cell, before, after)
            needs = [(("a", layer - 1), c) for c in window]
            tasks.append((("conv", layer, f"conv{layer}"), needs, False))
        if leads:
            tasks.append((("pool", layers, "pool"), [(("a", layers), c)
                                              for c in topo.block_cells(block)], False))
            tasks.append((("route", layers, "route"), [(("dpooled",), block)], True))
        tasks.append((("dz_top", layers, "dz_top"), [(("route",), cell)], True))
        for layer in range(layers, 0, -1):
            tasks.append((("grad", layer, f"grad{layer}"), [(("dz", layer), cell)], True))
            if layer > 1:
                window = topo.window(cell, after, before)
                needs = [(("dz", layer), c) for c in window]
                tasks.append((("dinput", layer, f"dinput{layer}"), needs, True))
        for send in spec.sends[cell]:
            tasks.append((send, [(send.field, i) for i in send.items], send.train_only))
        self.tasks = [t for t, _, _ in tasks]
        self.send_keys = [tuple(needs) if isinstance(t, Send) else () for t, needs, _ in tasks]
        self.needs_count = [len(needs) for _, needs, _ in tasks]
        self.train_only = [train for _, _, train in tasks]
        self.waiters: dict[Item, list[int]] = {}
        for index, (_, needs, _) in enumerate(tasks):
            for item in needs:
                self.waiters.setdefault(item, []).append(index)
        self.active = {mode: sum(1 for t in self.train_only if mode == Mode.TRAIN or not t)
                       for mode in Mode}
        self.inbox = {
            key: Expect(ITEMS, tuple((send.field, i) for i in send.items),
                        spec.item_shape(send.field, 0)[0], send.train_only)
            for key, send in spec.expects[cell].items()}
        parent = topo.parent[cell]
        self.inbox[(Kind.PARAMS, 0, 0, parent)] = Expect(PARAMS)
        self.inbox[(Kind.BATCH, 0, 0, parent)] = Expect(BATCH)
        for child in topo.children[cell]:
            self.inbox[(Kind.REDUCE, 0, 0, child)] = Expect(REDUCE, train_only=True)


class Wave:
    """Everything a node knows about one wave (one step number)."""

    def __init__(self, step: int, plan: NodePlan) -> None:
        self.step = step
        self.mode: Mode | None = None
        self.training = False
        self.params: dict[str, np.ndarray] | None = None
        self.params_vector: np.ndarray | None = None
        self.norm: tuple[np.ndarray, np.ndarray] | None = None
        self.batch_payload: np.ndarray | None = None
        self.batch = 0
        self.known: dict[Item, np.ndarray] = {}
        self.missing = list(plan.needs_count)  # per task: items still unknown
        self.ready: list[int] = [i for i, n in enumerate(self.missing) if n == 0]
        self.tasks_done = 0
        self.windows: dict[int, np.ndarray] = {}  # layer -> (c_in, k, k, B) input window
        self.winners: np.ndarray | None = None  # leader: argmax over its block's cells
        self.grad_parts: dict[int, np.ndarray] = {}  # layer -> this cell's dW|db, flat
        self.reduce_in: dict[Cell, np.ndarray] = {}
        self.reduced = False
        self.seen: set[tuple] = set()
        self.finished_at: dict[str, float] = {}

    def value(self, f: Field, item: Hashable) -> np.ndarray:
        return self.known[(f, item)]


class NodeMachine:
    """One cell of the mesh."""

    def __init__(self, spec: MeshSpec, cell: Cell, readings: dict[int, np.ndarray]) -> None:
        """`readings[split]` is (samples, in_channels) float32: this sensor's own log."""
        self.spec = spec
        self.mesh_id = spec.mesh_id
        self.cell = cell
        self.readings = readings
        topo = spec.topology
        self.parent = topo.parent[cell]
        self.children = topo.children[cell]
        self.neighbours = set(topo.neighbours(cell))
        self.plan = NodePlan(spec, cell)
        before, after = spec.offsets
        self.window_cells = topo.window(cell, before, after)
        self.grad_window_cells = topo.window(cell, after, before)
        self.block = topo.block_of(cell)
        self.block_cells = topo.block_cells(self.block)
        self.wave: Wave | None = None
        self.future: list[Message] = []
        self.stats: Counter[str] = Counter()
        self.seq = 0
        self._steps: dict[str, Callable[[Wave, int], None]] = {
            "conv": self._conv_forward, "pool": self._pool, "route": self._route,
            "dz_top": self._dz_top, "grad": self._weight_grad, "dinput": self._input_grad}

    # ------------------------------------------------------------- messages in
    def handle(self, message: Message, now: float = 0.0) -> list[Message]:
        """Take one decoded message; return the messages this node sends in response."""
        h = message.header
        key = (h.kind, h.layer, h.phase, h.src)
        expect = self.plan.inbox.get(key)
        if expect is None or h.mesh != self.mesh_id or h.dst != self.cell:
            self.stats[f"rejected:{self._reject_reason(message)}"] += 1
            return []
        wave, new_wave = self.wave, False
        if wave is None or h.step > wave.step:
            if expect.role != PARAMS:  # a neighbour is already in the next wave: keep it
                return self._buffer(message, "buffered_future")
            if wave is not None and not self._finished(wave):
                self.stats["abandoned_waves"] += 1
            self.wave = wave = Wave(h.step, self.plan)
            new_wave = True
        if h.step < wave.step:
            self.stats["stale"] += 1
            return []
        if key in wave.seen:
            self.stats["duplicates"] += 1
            return []
        started_before = wave.mode is not None
        out: list[Message] = []
        if not self._accept(wave, message, expect, out):
            return []
        wave.seen.add(key)
        self.stats["accepted"] += 1
        self._run_ready(wave, now, out)
        if self.future and (new_wave or (not started_before and wave.mode is not None)):
            pending, self.future = self.future, []
            for early in pending:
                out.extend(self.handle(early, now))
        return out

    def _reject_reason(self, message: Message) -> str:
        """Why a message is not one this node's plan receives (the slow path)."""
        h = message.header
        if h.mesh != self.spec.mesh_id:
            return "other_mesh"
        if h.dst != self.cell:
            return "not_for_me"
        if h.src not in self.neighbours:
            return "not_a_neighbour"
        if h.kind in (Kind.PARAMS, Kind.BATCH):
            return "not_from_parent"
        if h.kind == Kind.REDUCE:
            return "bad_reduce"
        return "unexpected"

    def _buffer(self, message: Message, why: str) -> list[Message]:
        """Keep a message that arrived before the wave it belongs to could use it."""
        if len(self.future) >= 64 * (len(self.neighbours) + 1):
            self.stats["rejected:buffer_full"] += 1
        else:
            self.future.append(message)
            self.stats[why] += 1
        return []

    def _accept(self, wave: Wave, message: Message, expect: Expect,
                out: list[Message]) -> bool:
        """Take a message's content into the wave, or count why it does not fit."""
        h, payload = message.header, message.payload
        if expect.role <= BATCH:
            return self._accept_control(wave, message, expect.role, out)
        if wave.mode is None:  # item messages before this wave's BATCH: wait for it
            self._buffer(message, "buffered_early")
            return False
        if expect.train_only and not wave.training:
            self.stats["rejected:unexpected"] += 1
            return False
        if expect.role == REDUCE:
            if payload.shape != (self.spec.conv_size,) or h.dtype != FLOAT32:
                self.stats["rejected:bad_reduce"] += 1
                return False
            wave.reduce_in[h.src] = payload
            return True
        if payload.shape != (len(expect.keys), expect.channels, wave.batch) or \
                h.dtype != FLOAT32:
            self.stats["rejected:bad_shape"] += 1
            return False
        for item, values in zip(expect.keys, payload, strict=True):
            self._put(wave, item, values)
        return True

    def _accept_control(self, wave: Wave, message: Message, role: int,
                        out: list[Message]) -> bool:
        """PARAMS and BATCH from the tree parent; both in hand -> the wave starts."""
        h, payload = message.header, message.payload
        if role == PARAMS:
            c = self.spec.model.in_channels
            if h.dtype != FLOAT32 or payload.shape != (self.spec.conv_size + 2 * c,):
                self.stats["rejected:bad_params"] += 1
                return False
            params, mean, std = self.spec.split_params(payload)
            if np.any(std <= 0):
                self.stats["rejected:bad_params"] += 1
                return False
            wave.params_vector, wave.params, wave.norm = payload, params, (mean, std)
        else:
            if h.dtype != INT32 or not self._valid_batch(payload):
                self.stats["rejected:bad_batch"] += 1
                return False
            wave.batch_payload = payload
        if wave.params is not None and wave.batch_payload is not None:
            self._start(wave, out)
        return True

    def _valid_batch(self, payload: np.ndarray) -> bool:
        if payload.ndim != 1 or payload.size < 3:
            return False
        mode, split, idx = int(payload[0]), int(payload[1]), payload[2:]
        if mode not in (Mode.TRAIN, Mode.INFER) or split not in self.readings:
            return False
        return bool(idx.min() >= 0 and idx.max() < len(self.readings[split]))

    def _start(self, wave: Wave, out: list[Message]) -> None:
        payload = wave.batch_payload
        wave.mode = Mode(int(payload[0]))
        wave.training = wave.mode == Mode.TRAIN
        indices = payload[2:]
        wave.batch = len(indices)
        mean, std = wave.norm
        x = self.readings[int(payload[1])][indices]  # (B, c_in)
        for child in self.children:
            out.append(self._message(wave, Kind.PARAMS, child, wave.params_vector))
            out.append(self._message(wave, Kind.BATCH, child, payload))
        self._put(wave, (("a", 0), self.cell),
                  np.ascontiguousarray(((x - mean) / std).T, np.float32))

    # ---------------------------------------------------------------- progress
    def _put(self, wave: Wave, key: Item, value: np.ndarray) -> None:
        if key in wave.known:
            return
        wave.known[key] = value
        for task in self.plan.waiters.get(key, ()):
            wave.missing[task] -= 1
            if wave.missing[task] == 0:
                wave.ready.append(task)

    def _run_ready(self, wave: Wave, now: float, out: list[Message]) -> None:
        """Run every task whose items are known (running one may ready others)."""
        if wave.mode is None:
            return
        plan, known, training = self.plan, wave.known, wave.training
        while wave.ready:
            index = wave.ready.pop()
            if plan.train_only[index] and not training:
                continue
            task = plan.tasks[index]
            if isinstance(task, Send):
                keys = plan.send_keys[index]
                values = known[keys[0]][None] if len(keys) == 1 else _stack(
                    [known[k] for k in keys])
                out.append(self._message(wave, task.kind, task.dst, values, task.layer,
                                         task.phase))
            else:
                step, layer, stage = task
                self._steps[step](wave, layer)
                wave.finished_at[stage] = now
            wave.tasks_done += 1
        if training and not wave.reduced and \
                len(wave.grad_parts) == self.spec.model.conv_layers and \
                len(wave.reduce_in) == len(self.children):
            self._reduce(wave, out)
            wave.finished_at["reduce"] = now
        if self._finished(wave) and "finished" not in wave.finished_at:
            wave.finished_at["finished"] = now

    def _finished(self, wave: Wave) -> bool:
        if wave.mode is None or wave.tasks_done < self.plan.active[wave.mode]:
            return False
        return wave.reduced or not wave.training

    # ------------------------------------------------------------ computation
    def _dz_top(self, wave: Wave, layers: int) -> None:
        """d(loss)/d(last conv's pre-activation): the routed gradient where ReLU passed."""
        active = wave.value(("a", layers), self.cell) > 0
        self._put(wave, (("dz", layers), self.cell), wave.value(("route",), self.cell) * active)

    def _window(self, wave: Wave, f: Field, cells: list[Cell], before: int,
                channels: int) -> np.ndarray:
        """(channels, k, k, B) window around this cell; cells outside the grid read 0."""
        k = self.spec.model.kernel
        window = np.zeros((channels, k, k, wave.batch), np.float32)
        r0, c0 = self.cell[0] - before, self.cell[1] - before
        for cell in cells:
            window[:, cell[0] - r0, cell[1] - c0] = wave.known[(f, cell)]
        return window

    def _conv_forward(self, wave: Wave, layer: int) -> None:
        before, _ = self.spec.offsets
        window = self._window(wave, ("a", layer - 1), self.window_cells, before,
                              self.spec.channels(layer - 1))
        w, b = wave.params[f"conv{layer}.weight"], wave.params[f"conv{layer}.bias"]
        z = w.reshape(w.shape[0], -1) @ window.reshape(-1, wave.batch) + b[:, None]
        if wave.training:
            wave.windows[layer] = window
        self._put(wave, (("a", layer), self.cell), np.maximum(z, 0.0, dtype=np.float32))

    def _pool(self, wave: Wave, layers: int) -> None:
        stacked = np.stack([wave.value(("a", layers), c) for c in self.block_cells])
        wave.winners = stacked.argmax(axis=0)  # first maximum in row-major order, as PyTorch
        self._put(wave, (("pooled",), self.block), stacked.max(axis=0))

    def _route(self, wave: Wave, layers: int) -> None:
        """Max-pool backward at the leader: each member gets the gradient where it won."""
        grad = wave.value(("dpooled",), self.block)
        for i, cell in enumerate(self.block_cells):
            self._put(wave, (("route",), cell),
                      np.where(wave.winners == i, grad, np.float32(0.0)).astype(np.float32))

    def _weight_grad(self, wave: Wave, layer: int) -> None:
        """This cell's share of d(loss)/d(conv weights, bias): its output times its window."""
        dz = wave.value(("dz", layer), self.cell)  # (h, B)
        dw = dz @ wave.windows[layer].reshape(-1, wave.batch).T
        wave.grad_parts[layer] = np.concatenate([dw.ravel(), dz.sum(axis=1)])

    def _input_grad(self, wave: Wave, layer: int) -> None:
        """d(loss)/d(this cell's input to `layer`): transposed convolution of the dz halo."""
        _, after = self.spec.offsets
        dzwin = self._window(wave, ("dz", layer), self.grad_window_cells, after,
                             self.spec.model.filters)
        w = wave.params[f"conv{layer}.weight"]
        flipped = w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)  # (c_in, h, k, k)
        da = flipped.reshape(flipped.shape[0], -1) @ dzwin.reshape(-1, wave.batch)
        active = wave.value(("a", layer - 1), self.cell) > 0
        self._put(wave, (("dz", layer - 1), self.cell), (da * active).astype(np.float32))

    def _reduce(self, wave: Wave, out: list[Message]) -> None:
        """Own partial gradients plus the children's, as one message to the parent."""
        layers = self.spec.model.conv_layers
        total = np.concatenate([wave.grad_parts[layer] for layer in range(1, layers + 1)])
        for part in wave.reduce_in.values():
            total += part
        out.append(self._message(wave, Kind.REDUCE, self.parent, total))
        wave.reduced = True

    def _message(self, wave: Wave, kind: Kind, dst: Cell, payload: np.ndarray,
                 layer: int = 0, phase: int = 0) -> Message:
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        return make(kind, self.spec.mesh_id, wave.step, self.cell, dst, payload,
                    layer=layer, phase=phase, seq=self.seq)

    # -------------------------------------------------------------- reporting
    @property
    def finished_at(self) -> dict[str, float]:
        """When (in transport time) this node finished each stage of its last wave."""
        return dict(self.wave.finished_at) if self.wave else {}
