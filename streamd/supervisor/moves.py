"""What a reload changes in the running workers, carried out over the supervisor's ticks: streams removed,
changed or added in place (``edit_streams``), a new model built beside each running worker and the streams
handed over once it is ready (``switch_model``), and everything that waits for an old worker to let go of its
streams (``advance``). The plan itself is ``streamd.supervisor.reload``'s."""

from __future__ import annotations

import logging
import threading

from streamd.protocol import Abort, EditStreams, Stop
from streamd.supervisor.pool import STREAMS_PER_WORKER, WorkerPool, WorkerSlot
from streamd.supervisor.reload import ReloadPlan

log = logging.getLogger("streamd.supervisor")


class StreamMoves:
    """Streams on their way between workers because of a reload (``pool`` carries them; ``stop`` is the
    supervisor's stop event: nothing new starts once it is set)."""

    def __init__(self, pool: WorkerPool, stop: threading.Event) -> None:
        self.pool = pool
        self.stop = stop
        self.waiting: list[tuple[str, ...]] = []  # stream groups whose old worker still drains
        self.leaving: dict[str, WorkerSlot] = {}  # removed streams whose worker still drains
        self.switches: list[tuple[WorkerSlot, WorkerSlot]] = []  # new model: (running, successor)

    @property
    def in_progress(self) -> bool:
        """A reload is not through yet: streams wait for a worker, leave one, or switch to a new model."""
        return bool(self.waiting or self.switches or self.leaving)

    def drop_orphaned_switches(self) -> None:
        """A worker that died while its successor built the new model: the spare took its streams, so the
        successor is not needed."""
        for old, successor in list(self.switches):
            if old not in self.pool.workers:
                self.pool.send(successor, Abort())
                self.switches.remove((old, successor))

    def abort_switches(self) -> None:
        """Stopping: a model switch still building is not needed any more."""
        for _, successor in self.switches:
            self.pool.send(successor, Abort())

    def edit_streams(self, plan: ReloadPlan) -> None:
        """Streams removed, changed or added by a reload, in place in the workers that carry them: only the
        touched streams stop and start, every other stream goes on untouched. A worker left with no stream
        drains and finishes; an added stream goes to the least loaded worker, or a new one when every worker
        carries its share (``STREAMS_PER_WORKER``, GPU with ``pipeline.workers: auto``)."""
        removed, changed = set(plan.removed), {s.id: s for s in plan.changed}
        for w in self.pool.workers:
            if (w.retired and not any(old is w for old, _ in self.switches)) or w.done or w.gave_up:
                continue
            gone = [sid for sid in w.stream_ids if sid in removed]
            edits = tuple(changed[sid] for sid in w.stream_ids if sid in changed)
            if not gone and not edits:
                continue
            w.stream_ids = tuple(sid for sid in w.stream_ids if sid not in removed)
            for sid in gone:
                self.pool.owner.pop(sid, None)
                self.leaving[sid] = w  # the sinks hear of it once the worker has let it go
            if w.retired:  # draining for a model switch: its successor adopts what is left, as configured now
                continue
            if not w.stream_ids:  # nothing left: it drains and finishes; every line it wrote stays
                w.retired = True
                self.pool.send(w, Stop())
            elif w.alive:
                self.pool.send(w, EditStreams(gone, edits, {}))
        homeless: list[str] = []
        for sc in plan.added:
            target = self.pool.worker_for_new_stream()
            if target is None:
                homeless.append(sc.id)
                continue
            target.stream_ids += (sc.id,)
            self.pool.owner[sc.id] = target
            if target.alive:
                self.pool.send(target, EditStreams([], (sc,), self.pool.resume_for((sc.id,))))
        for k in range(0, len(homeless), STREAMS_PER_WORKER):  # new workers, each for a share, not one each
            self.waiting.append(tuple(homeless[k : k + STREAMS_PER_WORKER]))

    def _stream_edits_done(self) -> None:
        """A worker's answer to an in-place edit: removed streams leave the sinks (MQTT marks them offline);
        streams it could not take (its streams had all ended) start in a new worker."""
        for w in self.pool.workers:
            while w.edits:
                edit = w.edits.pop(0)
                for sid in edit.removed:
                    if self.leaving.get(sid) is w:
                        del self.leaving[sid]
                        if self.pool.sink_set is not None and sid not in self.pool.owner:
                            self.pool.sink_set.stream_removed(sid)
                if edit.refused:
                    w.stream_ids = tuple(sid for sid in w.stream_ids if sid not in edit.refused)
                    self.waiting.append(tuple(edit.refused))

    def switch_model(self) -> None:
        """A new model or engine: beside each running worker a successor builds the new engine (held, no
        streams); once it is ready the running worker drains its last batches and finishes, then the
        successor adopts its streams with their frame numbering continuing (``advance``)."""
        for w in self.pool.workers:
            if w.retired or w.done or w.gave_up or not w.stream_ids:
                continue
            for old, succ in [x for x in self.switches if x[0] is w]:  # a newer model replaces a pending one
                self.pool.send(succ, Abort())
                self.switches.remove((old, succ))
            successor = WorkerSlot(-1, (), w.device)
            self.pool.spawn(successor, hold=True)
            self.switches.append((w, successor))
        self.pool.drop_spare()  # the spare holds the old model: build a new one later

    def _advance_switches(self) -> None:
        if self.stop.is_set():
            return
        for old, succ in list(self.switches):
            if succ.error is not None or (succ.process is not None and not succ.alive and not succ.ready):
                why = succ.error.message if succ.error else "it died while building"
                log.error(
                    "reload: the new model could not start (%s); worker %d keeps the old one", why, old.index
                )
                self.pool.send(succ, Abort())
                self.switches.remove((old, succ))
                continue
            if not succ.ready:
                continue
            if not old.retired:  # the new engine is built: the old worker finishes its batches in flight
                old.retired = True
                self.pool.send(old, Stop())
                continue
            reader_done = old.reader is None or not old.reader.is_alive()
            if not (old.done or (not old.alive and reader_done)):
                continue
            self.switches.remove((old, succ))
            self.pool.hand_over(old, succ)
            log.info("reload: stream(s) %s switched to the new model", ", ".join(old.stream_ids))

    def advance(self) -> None:
        """Start the workers a reload asked for once no older worker still carries one of their streams
        (frame numbers continue from the old worker's last line); tell the sinks about removed streams
        once their worker's last line is out (MQTT marks them offline); move streams to workers that
        built a new model."""
        self._advance_switches()
        self._stream_edits_done()
        for sid, w in list(self.leaving.items()):
            reader_done = w.reader is None or not w.reader.is_alive()
            if w.done or (not w.alive and reader_done):
                del self.leaving[sid]
                if self.pool.sink_set is not None and sid not in self.pool.owner:
                    self.pool.sink_set.stream_removed(sid)
        for group in list(self.waiting):
            busy = any(  # the old worker still runs, or its last lines are still on the way to the sinks
                (w.alive and not w.done) or (w.reader is not None and w.reader.is_alive())
                for w in self.pool.workers
                if w.retired and set(w.stream_ids) & set(group)
            )
            if busy or self.stop.is_set():
                continue
            self.waiting.remove(group)
            self.pool.add_worker(group)
