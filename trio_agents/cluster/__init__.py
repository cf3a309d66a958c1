"""Many control-server processes on one PostgreSQL database, acting as one server.

Needs the ``postgres`` extra (``pip install 'trio-agents[postgres]'``). Usage::

    cluster = PostgresCluster("postgresql://app@db/agents", node_id="node-a")
    server = ControlServer(agents, auth=tokens, cluster=cluster)

or ``trio-agents serve --cluster DSN [--node-id ID] [--lease-ttl S] [--max-runs N]``.
Every node serves the same agents; clients may connect to any node (behind any load
balancer) and see every run of their principal.

Tables (component ``cluster`` of ``trio_agents_schema``, schema version 5, created or
migrated by the library under an advisory lock, next to the session tables of
:class:`~trio_agents.sessions.PostgresSession`, which hold every run's conversation
under the session id ``json.dumps([principal, session_id])`` — or
``[principal, "run:<run_id>"]`` for a run started without a session)::

    trio_agents_nodes(node_id PK, lease_expires_at, max_runs, running, draining, updated_at)
        one row per live node; its heartbeat every lease_ttl/3 renews it
    trio_agents_runs(run_id PK, principal, session_id, session_key,
                     active_key UNIQUE WHERE NOT NULL,  -- = session_key while the run
                                                        -- holds its session
                     agent, options (JSON: the run's input; "cancel" once a
                                     cancel was acked; "decisions": approvals and
                                     rejections by call id; "client": the node of an
                                     on_disconnect="cancel" run's client; "on_busy"
                                     of a queued interrupt run), status, reason, turn,
                     pending (JSON list of call ids),
                     finished, owner (node_id), released, lease_expires_at, attempt,
                     last_seq, usage (JSON: what its limits counted so far, kept
                     across a takeover), run_usage (JSON: the run's own Usage so
                     far, its record's usage on every node), detail (JSON: its
                     current status's detail, its record's on every node),
                     created_at, updated_at)
    trio_agents_events(run_id, seq, type, data (the event's to_json(), JSON text),
                       PRIMARY KEY (run_id, seq))
    trio_agents_tool_starts(run_id, call_id, attempt, started_at, PK (run_id, call_id))
        written by the before_tool barrier before a tool executes
    trio_agents_children(run_id PK, root_id, parent_id, call_id, agent, last_seq,
                         finished, cancel (JSON: a cancel acked for it), created_at)
        a child run of a tree: its events are in trio_agents_events under its id,
        written (fenced by its root's row) by the node running the tree
    trio_agents_withdrawals(run_id, injection_id, PK (run_id, injection_id))
    trio_agents_commands(command_id BIGSERIAL PK, run_id, target_node, origin_node,
                         principal, op, args (the op's wire JSON, _routing.to_wire),
                         reply (JSON), created_at)

Rows of runs finished more than ``Limits.retain_finished`` ago (and their events, tool
starts, withdrawals and commands, their child runs' rows and events) are deleted by
whichever node sweeps first (each sweeps every minute).

Channel: one, ``trio_agents_cluster``; payloads are JSON objects with a kind ``k``:
``{"k": "run", "r": run_id, "s": last_seq}`` (a run's events up to ``s`` are persisted;
followed by a newline and the flush's events of the run, ``[[seq, event], ...]``, as
many as fit: subscribers on other nodes send those and read the table for the rest),
``{"k": "cmd", "n": node}`` (commands wait for
``node``; with ``"c"``, ``"r"``, ``"p"``, ``"a"``, ``"o"`` — command id, run, principal,
the request, origin node — when the request is short enough to travel inline),
``{"k": "reply", "n": node, "c": command_id}`` (a command of ``node`` was answered; the
answer inline in ``"a"`` when short), ``{"k": "scan"}`` (a node released its runs: take
them over now). The tables stay the record: a NOTIFY lost with a connection is made up
for by reading them (after a reconnection, and by bounded polls).

What holds (DESIGN §12):

- Every event of a run is persisted in order by a writer task of its node, in batches
  flushed at least every 100 ms and at once at every ``run.item``, ``run.updated`` and
  ``inbox.injected``; nothing in a run's own loop waits for the database (except the
  ``before_tool`` barrier: one transaction before each tool call executes, and its
  session writes). A ``run.item`` event and its item are written in one transaction
  (the flush appends the item to the session), so the session and the event log agree
  after any crash. ``run.inject`` is
  acked once its ``inbox.injected`` event is persisted; ``run.cancel`` (and
  ``session.cancel``) once the cancel is recorded in the run's row, so a takeover ends
  the run ``cancelled`` with that reason (the session repaired as by a cancel) instead
  of continuing it. ``run.approve`` / ``run.reject`` once the decision is recorded in
  the run's row (before it is applied): a takeover applies it to the call asked again.
- Any node answers for any run of its principal: ``run.get`` and ``runs.list`` read
  the runs table (a node's own runs from memory); ``run.subscribe`` on a node that
  does not run it (or whose attempt here was stopped) replays the events table from
  ``from_seq`` and follows by NOTIFY, and ends at once when ``from_seq`` is past the
  end of a finished run; the other ops are routed to the owner through the commands table and its own answer comes
  back. An op for a run whose owner died waits until the run is taken over and is
  answered by the new owner, or answers ``internal`` ("retry") after 30 s.
- Known gaps: a run whose node died before the run's input reached its session is
  resumed with the input kept in its row if its session is empty, else with what the
  session holds.
- A placed ``run.start`` gets its id from the placing node; when no answer comes in
  time, that node withdraws the command (which the start, holding the command's row
  while it inserts the run's, cannot outrun) and acks the run if its row exists, else
  answers ``internal``: no run goes on that its client was told failed.
- ``on_disconnect="cancel"`` runs record the node holding their client's connection;
  once that node is dead (lease expired, or stopped), their owner (its scan), or the
  node taking one over, cancels them (``"client disconnected"``).
- One active run per session across the cluster (``active_key``); ``on_busy`` holds
  cluster-wide. A ``run.start`` that waits (``enqueue``/``interrupt``) is acked at
  once, ``queued``; queued runs get the session in the order they were queued
  (``interrupt`` runs first), cluster-wide.
- A node runs at most ``max_runs`` runs; a ``run.start`` on a full node is started on
  the least loaded node with room; when every node is full it is acked and the run is
  *queued for capacity* (an unowned row, status ``queued``, first event persisted),
  claimed by the takeover scan of the first node with room, in the order of the starts
  (``_capacity.py``); at most ``Limits.max_runs_per_principal`` such runs per
  principal (``limit_exceeded`` past it).
- Leases: a node that stops heartbeating for ``lease_ttl`` loses its runs: another
  node claims each one (``attempt + 1``) and resumes it from its session
  (:class:`trio_agents.Resume`): a call whose tool had started (``tool_starts``) and
  has no result gets ``interrupted`` unless its tool is ``idempotent=True``, which
  runs again; injections acked but not delivered are injected again (with new ids),
  except those whose items the session already holds after the last item committed
  before them (delivered, their ``inbox.delivered`` lost with the node).
  A node shut down gracefully (SIGTERM, or the scope around ``serve()`` cancelled)
  hands its runs over at once: it stops them without persisting anything more and
  releases them. Its subscribers' streams end without a terminal event; they
  re-subscribe on another node from the next seq.
- The heartbeat runs in its own task, on its own connection: no scan, resumption,
  cleanup or pooled work delays it (the cleanup skips locked rows and gives up after
  ``lease_ttl / 4``), and it never waits for a run's row lock (``SKIP LOCKED``; the
  flush holding the row renews that run's lease). A node that stops its runs on its
  own (lease lost) releases them at its next heartbeat, so they are taken over (there
  or on any node).
- A frozen node (a paused process or VM, a partition) never blocks its takeover for
  long: every transaction of a node ends once idle for half the lease (1 to 5 s,
  ``idle_in_transaction_session_timeout``), releasing its row locks; every connection
  has TCP keepalives. docs/cluster.md gives the failure timeline.
- Fencing in the database: the ``before_tool`` barrier's insert and every session
  write check, in their transaction under the run's row lock, that the row still names
  this node and attempt: a node that stalled past its lease and was taken over never
  starts a tool or writes to the session afterwards.
- Reconnection: every part retries with backoff when PostgreSQL is unreachable; the
  LISTEN connection reconnects and every waiter re-reads the tables (NOTIFY is lost
  while disconnected).

Not exactly-once: a tool not declared idempotent runs at most once (it may be
interrupted); an idempotent one at least once. A routed op is answered once: its
answer is stored with its durable effect, so an owner that dies while answering it
leaves the answer for the client's node and the op is not applied again. Events a node emitted but had not yet
persisted when it died are lost (the seqs are reused by the next attempt); no client saw
them: every subscriber, on the owner too, is sent an event only once it is persisted
(the writer flushes at once while one waits), so exact replay across a crash holds for
every subscriber.
"""

from ._cluster import ClusterStatistics as ClusterStatistics
from ._cluster import PostgresCluster as PostgresCluster
from ._db import ClusterDown as ClusterDown
from ._db import ClusterSchemaError as ClusterSchemaError

__all__ = ["ClusterDown", "ClusterSchemaError", "ClusterStatistics", "PostgresCluster"]
