"""dquant: LLM token batches made next to the data, delivered into this process.

``dquant.open`` runs a *plan* (which token datasets, blended how, packed into samples of
which length, shuffled how, for which data-parallel rank) either on a dquant agent
(``offload=True``: ``dquant serve`` near the data, batches arriving over TCP or a
shared-memory ring) or in this process (``offload=False``). Both give the same bytes.

Iterating a reader yields numpy arrays of shape ``(batch_size, seq_len + 1)`` in the plan's
output dtype, over the memory the batch was made in: nothing is copied to hand it over, and
``torch.from_numpy`` shares it too. An array keeps its memory alive for as long as it (or a
tensor over it) lives.

    >>> import dquant
    >>> plan = {"sources": [{"uri": "data/r50k_int32"}], "seq_len": 2048, "batch_size": 8}
    >>> with dquant.open(plan, offload=False) as reader:
    ...     for batch in reader:            # numpy (8, 2049) int32
    ...         ...
    ...     state = reader.cursor()         # {"epoch": 0, "consumed_samples": ...}

For PyTorch training, see ``dquant.torch.TokenDataset``.
"""

from __future__ import annotations

import builtins
import json
import os
from typing import Any, Dict, Mapping, Optional, Sequence, Union

from ._dquant import (
    AgentError,
    AgentShutdown,
    Batch,
    Provenance,
    Reader,
    __version__,
    merge_cursors_json,
    open_reader,
    subscribe_reader,
    transports,
)

__all__ = [
    "open",
    "subscribe",
    "merge_cursors",
    "locate",
    "samples_of",
    "Reader",
    "Batch",
    "AgentError",
    "AgentShutdown",
    "plan_of",
    "__version__",
]

_SCHEME = "dquant://"
# The library's transport registry, so this list is what the library accepts.
_TRANSPORTS = tuple(transports())


def _check_transport(transport: Optional[str]) -> None:
    if transport is not None and transport not in _TRANSPORTS:
        names = ", ".join(repr(t) for t in _TRANSPORTS)
        raise ValueError(f"transport must be {names} or None, not {transport!r}")


def plan_of(uri_or_plan: Union[str, os.PathLike, Mapping[str, Any]], **fields: Any) -> dict:
    """The plan ``uri_or_plan`` describes, as a dict, with ``fields`` set on top.

    ``uri_or_plan`` is a plan dict; a plan as JSON text; the path of a plan file (``.json``
    or ``.toml``); or one dataset (a local path or ``dquant://HOST:PORT/ROOT/PATH``), which
    becomes a one-source plan (``seq_len`` and ``batch_size`` then come from ``fields``).
    """
    if isinstance(uri_or_plan, Mapping):
        plan = json.loads(json.dumps(dict(uri_or_plan)))  # a deep copy of plain data
    elif isinstance(uri_or_plan, (str, os.PathLike)):
        text = os.fspath(uri_or_plan)
        if text.lstrip().startswith("{"):
            try:
                plan = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"plan: invalid JSON: {e}") from None
        elif text.endswith((".json", ".toml")) and os.path.isfile(text):
            plan = _load_plan_file(text)
        else:
            plan = {"sources": [{"uri": text}]}
    else:
        raise TypeError(
            "dquant.open: expected a plan (dict, JSON text or a .json/.toml file) or a "
            f"dataset URI, got {type(uri_or_plan).__name__}"
        )
    if not isinstance(plan, dict):
        raise ValueError(f"plan: expected a JSON object, got {type(plan).__name__}")
    plan.update(fields)
    return plan


def _load_plan_file(path: str) -> dict:
    with builtins.open(path, "rb") as f:
        data = f.read()
    if path.endswith(".json"):
        try:
            return json.loads(data)
        except json.JSONDecodeError as e:
            raise ValueError(f"plan file {path}: invalid JSON: {e}") from None
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        raise ValueError(
            f"plan file {path}: TOML plans need Python 3.11+ (tomllib); use a .json plan"
        ) from None
    try:
        return tomllib.loads(data.decode())
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"plan file {path}: invalid TOML: {e}") from None


def _split_agent(uri: str) -> tuple[str, str]:
    """``dquant://HOST:PORT/ROOT/PATH`` -> (``dquant://HOST:PORT``, ``ROOT/PATH``)."""
    rest = uri[len(_SCHEME) :]
    authority, _, dataset = rest.partition("/")
    return _SCHEME + authority, dataset


def _with_option(agent: str, key: str, value: Any) -> str:
    """The agent address ``agent`` with the option ``key=value`` added."""
    sep = "&" if "?" in agent else "?"
    return f"{agent}{sep}{key}={value}"


def _with_transport(agent: str, transport: Optional[str]) -> str:
    if transport is None:
        return agent
    return _with_option(agent, "transport", transport)


def open(
    uri_or_plan: Union[str, os.PathLike, Mapping[str, Any]],
    offload: bool = True,
    transport: Optional[str] = None,
    *,
    agent: Optional[str] = None,
    cursor: Optional[Mapping[str, int]] = None,
    share: Optional[str] = None,
    share_group: int = 0,
    **fields: Any,
) -> Reader:
    """Opens a plan and returns a :class:`Reader` over its batches.

    Args:
        uri_or_plan: a plan (dict, JSON text, or a ``.json``/``.toml`` file), or one dataset
            URI (see :func:`plan_of`).
        offload: ``True`` runs the plan on the agent (``agent=``, or the agent a
            ``dquant://`` dataset URI names); ``False`` runs it in this process, reading
            local paths or pulling ``dquant://`` datasets by range. Same bytes either way.
        transport: ``"tcp"``, ``"shm"`` or ``None`` (from the agent address: a Unix socket
            path means the shared-memory ring, ``dquant://HOST:PORT`` means TCP).
        agent: the agent: ``dquant://HOST:PORT`` or the path of its Unix socket
            (``dquant serve --socket PATH``). Plan sources are then dataset names on it,
            ``ROOT/PATH``.
        cursor: where to start, as returned by :meth:`Reader.cursor` (default: the start).
        share: open the plan on the agent as the shared stream of this name (e.g.
            ``"job42/dp3"``), or join the stream of that name another reader of the same
            tenant opened with the same plan: the agent runs the plan once and every reader of
            the stream gets the same batches (the tensor-parallel ranks of one data-parallel
            rank). ``cursor`` must then be the stream's current cursor or a batch boundary
            still in its window. See also :func:`subscribe`.
        share_group: with ``share``: the stream makes no batch until this many readers have
            joined (this one included), at most the agent's ticket lifetime; 0 or 1 starts at
            once.
        **fields: plan fields set on top of the plan (``seq_len=2048``, ``batch_size=8``,
            ``rank=``, ``world=``, ``output="u16"``, ...).

    Raises:
        ValueError: a bad plan or arguments (the message says what and where).
        FileNotFoundError: a dataset the plan names does not exist (locally or on the agent).
        ConnectionError: the agent cannot be reached.
        dquant.AgentError: the agent refused or failed the session.
    """
    plan = plan_of(uri_or_plan, **fields)
    _check_transport(transport)
    sources = plan.get("sources")
    if agent is None and offload and isinstance(sources, list) and sources:
        # One agent named by the sources' URIs: run there, naming datasets relative to it.
        uris = [s.get("uri", "") if isinstance(s, Mapping) else "" for s in sources]
        if all(isinstance(u, str) and u.startswith(_SCHEME) for u in uris):
            agents = {_split_agent(u)[0] for u in uris}
            if len(agents) == 1:
                agent = agents.pop()
                for s, u in zip(sources, uris):
                    s["uri"] = _split_agent(u)[1]
    if offload and agent is None:
        raise ValueError(
            "offload=True needs an agent: pass agent='dquant://HOST:PORT' or the path of its "
            "Unix socket, use dquant:// dataset URIs, or pass offload=False to run the plan "
            "in this process"
        )
    if not offload and transport is not None:
        raise ValueError("transport applies only with offload=True (an agent sends the batches)")
    if share is not None and not offload:
        raise ValueError("share applies only with offload=True (the agent runs the shared stream)")
    target = _with_transport(os.fspath(agent), transport) if agent is not None else ""
    return open_reader(
        json.dumps(plan), target, bool(offload), _cursor_json(cursor), share or "", int(share_group)
    )


def subscribe(
    agent: str,
    share: str,
    cursor: Optional[Mapping[str, int]] = None,
    transport: Optional[str] = None,
) -> Reader:
    """Joins the shared stream ``share`` that another reader of this tenant opened on
    ``agent`` (``dquant.open(..., share=NAME)``), and returns a :class:`Reader` over it: the
    same batches every reader of the stream gets, made once on the agent. The plan comes
    from the agent.

    Args:
        agent: ``dquant://HOST:PORT`` or the path of the agent's Unix socket.
        share: the stream's name.
        cursor: where to start: a batch boundary still in the stream's window (the agent
            keeps its last ``share_window_batches``). Default: the stream's current cursor.
        transport: ``"tcp"``, ``"shm"`` or ``None``, as for :func:`open`.

    Raises:
        FileNotFoundError: the agent has no stream of that name for this tenant.
        dquant.AgentError: a cursor no longer in the stream's window (the message says
            which batches it holds).
    """
    _check_transport(transport)
    target = _with_transport(os.fspath(agent), transport)
    return subscribe_reader(target, share, _cursor_json(cursor))


def _cursor_json(cursor: Optional[Mapping[str, Any]]) -> str:
    """A cursor dict as the JSON the extension takes ("" for the start)."""
    if cursor is None:
        return ""
    try:
        c = {"epoch": int(cursor.get("epoch", 0)), "consumed_samples": int(cursor["consumed_samples"])}
        for key in ("blend", "delivered"):
            if cursor.get(key):
                c[key] = [int(x) for x in cursor[key]]
        unknown = set(cursor) - {"epoch", "consumed_samples", "blend", "delivered"}
        if unknown:
            raise KeyError(unknown)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise ValueError(
            "cursor must be {'epoch': int, 'consumed_samples': int} with optional 'blend' and "
            f"'delivered' lists of ints, got {cursor!r}"
        ) from None
    return json.dumps(c)


def merge_cursors(cursors: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """Merges the cursors of all sub-ranks of one run into one cursor that a job on any
    number of ranks (and DataLoader workers) resumes from, nothing lost and nothing repeated.

    ``cursors[r]`` is where sub-rank ``r`` stands (the ``cursor()`` of the reader that ran the
    plan as ``rank=r`` of ``world=len(cursors)``, after the last batch the training loop
    received from it). Each new rank then opens the plan at the merged cursor with its own
    ``rank`` and ``world``.

        >>> merged = dquant.merge_cursors([r.cursor() for r in readers])
        >>> reader = dquant.open(plan, cursor=merged, rank=0, world=3)
    """
    return json.loads(merge_cursors_json([_cursor_json(c) for c in cursors]))


# Plans asked about, bound to their opened sources (a document index is read once per plan).
_PROVENANCE: Dict[str, Provenance] = {}
_PROVENANCE_KEEP = 4


def _provenance(plan: Any) -> Provenance:
    text = json.dumps(plan_of(plan), sort_keys=True)
    p = _PROVENANCE.pop(text, None) or Provenance(text)
    _PROVENANCE[text] = p  # most recent last
    while len(_PROVENANCE) > _PROVENANCE_KEEP:
        _PROVENANCE.pop(next(iter(_PROVENANCE)))
    return p


def locate(plan: Any, sample: int) -> Dict[str, Any]:
    """Where global sample ``sample`` of ``plan`` goes and where its tokens come from.

    Returns ``{"sample", "epoch", "step", "rank", "pieces"}`` as ``dquant locate --json``
    prints it: ``step`` and ``rank`` receive the sample under the plan's ``batch_size`` and
    ``world``; each piece is ``{"source", "uri", "document", "offset", "length"}``, and the
    pieces in order are the sample's ``seq_len + 1`` tokens. ``plan`` is anything
    ``plan_of`` takes. Computed from the plan, no stream is read.

        >>> dquant.locate("plan.toml", 123456)["pieces"][0]["document"]
    """
    return json.loads(_provenance(plan).locate_json(int(sample)))


def samples_of(
    plan: Any, source: int, document: int, range: Optional[Sequence[int]] = None
) -> list:
    """Every global sample of ``plan`` that holds any token of document ``document`` of
    source ``source`` (its index in the plan's sources), ascending: for a takedown request or
    a contamination audit. ``range=(start, end)`` limits it to samples ``start..end``
    (``end`` excluded); the default is the whole plan. Computed through the inverse
    shuffle, in time proportional to the answer.
    """
    if range is None:
        return _provenance(plan).samples_of(int(source), int(document))
    try:
        start, end = (int(x) for x in range)
    except (TypeError, ValueError):
        raise ValueError(f"range must be (start, end), got {range!r}") from None
    if start > end:
        raise ValueError(f"range {range!r}: the start is past the end")
    return _provenance(plan).samples_of(int(source), int(document), start, end)
