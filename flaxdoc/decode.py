"""Constrained Viterbi decoding and assembly of tags back into entities.

A tagger scores every token (or word) against a BIOES or BIO tag vocabulary
(`flaxdoc.tags.tag_names`). Taking the arg-max per position can produce tag
sequences that describe no entity (`O I-x`, `B-x E-y`, ...); seqeval's strict
mode then silently loses those entities. This module decodes instead the best
*valid* sequence (DESIGN.md §3.8):

1. `allowed_transitions` turns the tag vocabulary into boolean constraints:
   which tag may follow which, which may start and which may end a sequence.
2. `viterbi_numpy` (one sequence, reference) and `viterbi_jnp` (a padded batch,
   jit-able, one `lax.scan` forward and one backward) find the sequence of
   highest total score among those the constraints allow.
3. `word_scores_from_tokens` pools sub-token scores into word scores, since
   entities and metrics live on words.
4. `entities_from_word_tags` reads entities out of word tags, with their text,
   their box in page pixels and a confidence; `word_tags_from_entities` goes
   back; `decode_document` does steps 2 and 4 for one `Document`.

Scores are log-probabilities or logits; the decoders maximise their sum along
the path. Transition arguments may be boolean (allowed / forbidden) or float
log-potentials (a CRF's transition matrix, `-inf` for forbidden).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from flaxdoc import tags as tagging
from flaxdoc.data.document import Document, DocumentError

# A finite stand-in for log(0). Emissions of -inf (and, in `viterbi_jnp`, NaN)
# are raised to this floor so that every position keeps a finite best score and
# the back-pointers always follow allowed transitions: with -inf everywhere in
# a row, arg-max ties would pick tag 0 regardless of the constraints. It is far
# below any real log-probability, and small enough that summing it over 10^5
# positions stays finite in float32.
LOG_ZERO = -1e9

REDUCTIONS = ("first", "mean")


# ---------------------------------------------------------------- constraints
def allowed_transitions(tag_names: Sequence[str], scheme: str = "BIOES"
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Which tags may follow which, start and end a sequence.

  BIOES: after `O`, `E-x` or `S-x` come `O`, `B-y` or `S-y` (any y); after
  `B-x` or `I-x` only `I-x` or `E-x` (same x). A sequence starts with `O`, `B`
  or `S` and ends with `O`, `E` or `S`.
  BIO: `I-x` only after `B-x` or `I-x` (same x); `O` and `B-y` after anything.
  A sequence starts with anything but `I` and may end with anything.

  Args:
    tag_names: the tag vocabulary, e.g. `flaxdoc.tags.tag_names(labels, scheme)`
      (any order; the returned arrays follow it).
    scheme: "BIOES" or "BIO".

  Returns:
    `(trans bool [T, T], start bool [T], end bool [T])` with `trans[i, j]` true
    when tag `j` may directly follow tag `i`.

  Raises:
    ValueError: a malformed or duplicate tag, or a prefix the scheme lacks.
  """
  scheme = tagging.check_scheme(scheme)
  parsed = _parse_tag_names(tag_names, scheme)
  num = len(parsed)
  trans = np.zeros((num, num), bool)
  start = np.zeros(num, bool)
  end = np.zeros(num, bool)
  for i, (p, label) in enumerate(parsed):
    if scheme == "BIOES":
      start[i] = p in ("O", "B", "S")
      end[i] = p in ("O", "E", "S")
    else:
      start[i] = p != "I"
      end[i] = True
    for j, (q, next_label) in enumerate(parsed):
      trans[i, j] = _may_follow(p, label, q, next_label, scheme)
  return trans, start, end


def _may_follow(p: str, label: str | None, q: str, next_label: str | None, scheme: str) -> bool:
  """True when tag `(q, next_label)` may follow tag `(p, label)`."""
  if scheme == "BIOES":
    if p in ("B", "I"):  # inside an open entity: continue or close it, same label
      return q in ("I", "E") and next_label == label
    return q in ("O", "B", "S")  # after O, E, S: no entity is open
  if q == "I":  # BIO
    return p in ("B", "I") and next_label == label
  return True


def _parse_tag_names(tag_names: Sequence[str], scheme: str) -> list[tuple[str, str | None]]:
  if isinstance(tag_names, str):
    raise ValueError("tag_names must be a sequence of tags, got a single string")
  names = list(tag_names)
  if not names:
    raise ValueError("tag_names is empty")
  if len(set(names)) != len(names):
    dup = sorted({t for t in names if names.count(t) > 1})
    raise ValueError(f"duplicate tags in tag_names: {dup}")
  parsed = [tagging.split_tag(t) for t in names]
  if scheme == "BIO":
    bad = [t for t, (p, _) in zip(names, parsed) if p in ("E", "S")]
    if bad:
      raise ValueError(f"tags {bad} have prefixes that the BIO scheme does not use")
  return parsed


def first_invalid_transition(tags: Sequence[str], scheme: str = "BIOES") -> int | None:
  """The first position whose tag breaks the scheme's grammar, or None.

  Position `len(tags)` means the sequence ends inside an open entity (BIOES).
  A valid sequence is exactly one that tags its own entities: every chunk is
  well formed, so no entity is lost by seqeval's strict reading.
  """
  scheme = tagging.check_scheme(scheme)
  prev_p, prev_label = "O", None
  for i, tag in enumerate(tags):
    p, label = tagging.split_tag(tag)
    if scheme == "BIO" and p in ("E", "S"):
      return i
    if i == 0:
      ok = p in ("O", "B", "S")  # same rule for both schemes (BIO has no S)
    else:
      ok = _may_follow(prev_p, prev_label, p, label, scheme)
    if not ok:
      return i
    prev_p, prev_label = p, label
  if scheme == "BIOES" and prev_p in ("B", "I"):
    return len(tags)
  return None


# ---------------------------------------------------------------- Viterbi
def _log_potential_np(x, name: str, shape: tuple[int, ...]) -> np.ndarray:
  """Boolean constraints -> 0 / -inf; float potentials are used as given."""
  x = np.asarray(x)
  if x.shape != shape:
    raise ValueError(f"{name} must have shape {list(shape)}, got {list(x.shape)}")
  if x.dtype == bool:
    return np.where(x, 0.0, -np.inf)
  if x.dtype.kind not in "fiu":
    raise ValueError(f"{name} must be boolean or numeric, got dtype {x.dtype}")
  x = x.astype(np.float64)
  if np.isnan(x).any() or (x == np.inf).any():
    raise ValueError(f"{name} contains NaN or +inf")
  return x


def viterbi_numpy(scores, trans, start, end) -> tuple[np.ndarray, float]:
  """The highest-scoring allowed tag sequence for one sequence (numpy, float64).

  Args:
    scores: `[L, T]` per-position tag scores (log-probabilities or logits).
      `-inf` means impossible (it is raised to `LOG_ZERO`, see there); NaN and
      `+inf` are errors.
    trans: `[T, T]`, boolean (`trans[i, j]`: tag j may follow tag i) or float
      log-potentials added to the score (`-inf` = forbidden).
    start: `[T]` boolean or float, for the first position.
    end: `[T]` boolean or float, for the last position.

  Returns:
    `(tags int64 [L], score)` where `score` is the sum of the path's emission
    scores plus its start, transition and end potentials (0 for boolean ones).
    Ties go to the lowest tag id, as in `viterbi_jnp`. An empty sequence gives
    `([], 0.0)`.

  Raises:
    ValueError: bad shapes, NaN/+inf scores, or no sequence satisfies the
      constraints (impossible with `allowed_transitions`, where all-`O` is valid).
  """
  scores = np.asarray(scores)
  if scores.ndim != 2:
    raise ValueError(f"scores must have shape [L, T], got {list(scores.shape)}")
  if scores.dtype.kind not in "fiu":
    raise ValueError(f"scores must be numeric, got dtype {scores.dtype}")
  length, num_tags = scores.shape
  if num_tags == 0:
    raise ValueError("scores has no tag columns (T == 0)")
  trans = _log_potential_np(trans, "trans", (num_tags, num_tags))
  start = _log_potential_np(start, "start", (num_tags,))
  end = _log_potential_np(end, "end", (num_tags,))
  if length == 0:
    return np.zeros(0, np.int64), 0.0
  emit = scores.astype(np.float64)
  if np.isnan(emit).any() or (emit == np.inf).any():
    bad = np.argwhere(np.isnan(emit) | (emit == np.inf))[0]
    raise ValueError(f"scores[{bad[0]}, {bad[1]}] is {emit[tuple(bad)]}; "
                     "scores must be finite or -inf")
  emit = np.maximum(emit, LOG_ZERO)

  back = np.zeros((length, num_tags), np.int64)
  delta = start + emit[0]  # [T] best score of a path ending in each tag
  for t in range(1, length):
    cand = delta[:, None] + trans  # [T_prev, T_next]
    back[t] = np.argmax(cand, axis=0)
    delta = cand[back[t], np.arange(num_tags)] + emit[t]
  final = delta + end
  last = int(np.argmax(final))
  best = float(final[last])
  if best == -np.inf:
    raise ValueError("no tag sequence satisfies the transition constraints")
  path = np.zeros(length, np.int64)
  path[-1] = last
  for t in range(length - 1, 0, -1):
    path[t - 1] = back[t, path[t]]
  return path, best


def _log_potential_jnp(x) -> jax.Array:
  x = jnp.asarray(x)
  if x.dtype == jnp.bool_:
    return jnp.where(x, 0.0, -jnp.inf).astype(jnp.float32)
  return x.astype(jnp.float32)


@functools.partial(jax.jit, static_argnames=("return_score",))
def viterbi_jnp(scores, mask, trans, start, end, *, return_score: bool = False):
  """Batched constrained Viterbi in JAX: one forward `lax.scan`, one backward.

  The work per position is a `[B, T, T]` max-plus product; nothing loops over
  `L` in Python, and the function is jitted (the shapes, hence `T`, are static).

  Masks: positions with `mask == False` are skipped: the decoder runs over the
  valid positions of each row as one sequence (start constraint at the first
  valid position, end constraint at the last, transitions between consecutive
  valid positions), and skipped positions get tag 0 (`O`). The usual case is a
  prefix mask (padding at the end); a mask with holes decodes the subsequence
  of valid positions, the same as `viterbi_numpy(scores[b][mask[b]])`. A row
  without valid positions gets all zeros and score 0.

  Non-finite scores cannot raise under `jit`: NaN and `-inf` are treated as
  `LOG_ZERO` (impossible), `+inf` is clipped to `-LOG_ZERO`.

  Args:
    scores: `[B, L, T]` tag scores (any float dtype; computed in float32).
    mask: `[B, L]` booleans, or None for all valid.
    trans: `[T, T]` boolean or float log-potentials, as in `viterbi_numpy`.
    start: `[T]` boolean or float.
    end: `[T]` boolean or float.
    return_score: also return the `[B]` best-path scores.

  Returns:
    `int32 [B, L]` tags (and `float32 [B]` scores when `return_score`).
  """
  scores = jnp.asarray(scores, jnp.float32)
  batch, length, num_tags = scores.shape
  if mask is None:
    mask = jnp.ones((batch, length), bool)
  mask = jnp.asarray(mask).astype(bool)
  trans = _log_potential_jnp(trans)  # [T, T]
  start = _log_potential_jnp(start)  # [T]
  end = _log_potential_jnp(end)  # [T]
  emit = jnp.where(jnp.isnan(scores), LOG_ZERO, scores)
  emit = jnp.clip(emit, LOG_ZERO, -LOG_ZERO)  # [B, L, T]

  def forward(carry, xs):
    delta, seen = carry  # [B, T] best score per end tag; [B] any valid position yet
    e, m = xs  # [B, T], [B]
    best = jnp.max(delta[:, :, None] + trans[None], axis=1)  # [B, T_next]
    new = jnp.where(seen[:, None], best, start[None]) + e
    delta_out = jnp.where(m[:, None], new, delta)
    # Emit the incoming scores: backtracking recomputes the arg-max from them.
    return (delta_out, seen | m), (delta, seen & m)

  init = (jnp.zeros((batch, num_tags), jnp.float32), jnp.zeros((batch,), bool))
  xs = (jnp.swapaxes(emit, 0, 1), jnp.swapaxes(mask, 0, 1))  # [L, B, T], [L, B]
  (delta, seen), (prev_delta, follows) = jax.lax.scan(forward, init, xs)  # [L, B, T], [L, B]
  final = delta + end[None]  # [B, T]
  last = jnp.argmax(final, axis=-1).astype(jnp.int32)  # [B]

  # Backtracking recomputes the arg-max for the one tag on the path ([B, T] per
  # position) instead of storing a [B, T, T] arg-max of back-pointers: 10x
  # faster on CPU at T = 121. Same float sums as forward, so ties break alike
  # (lowest id). Skipped positions and the first valid one keep the tag.
  def backward(tag, xs):
    d, f = xs  # [B, T] scores at the previous valid position, [B]
    cand = d + jnp.take(trans, tag, axis=1).T  # [B, T_prev]
    prev = jnp.argmax(cand, axis=-1).astype(jnp.int32)  # [B]
    return jnp.where(f, prev, tag), tag

  _, path = jax.lax.scan(backward, last, (prev_delta, follows), reverse=True)  # [L, B]
  path = jnp.where(mask, jnp.swapaxes(path, 0, 1), 0)  # [B, L]
  if return_score:
    score = jnp.where(seen, jnp.max(final, axis=-1), 0.0)  # [B]
    return path, score
  return path


# ---------------------------------------------------------------- tokens -> words
def word_scores_from_tokens(token_scores, word_ids, num_words: int, reduce: str = "first",
                            *, missing: str = "outside") -> np.ndarray:
  """Pools sub-token tag scores into one row per word.

  Args:
    token_scores: `[L, T]` scores of the tokens of one document.
    word_ids: `[L]` integers, the word of each token, `-1` for tokens of no
      word (special tokens, padding).
    num_words: `W`, the number of words in the document.
    reduce: "first" takes each word's first token (the usual labelling when
      training labels go on first sub-tokens only); "mean" averages all of a
      word's tokens (pass log-probabilities to average in log space).
    missing: what to do with words that no token covers (truncated documents):
      "outside" gives them a row that makes them certainly `O` (tag id 0 scores
      0, every other tag `LOG_ZERO`), "error" raises. Nothing is dropped.

  Returns:
    `[W, T]` float word scores (at least float32).

  Raises:
    ValueError: shapes disagree, word ids out of range, unknown `reduce` or
      `missing`, or missing words under `missing="error"`.
  """
  if reduce not in REDUCTIONS:
    raise ValueError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}")
  if missing not in ("outside", "error"):
    raise ValueError(f"missing must be 'outside' or 'error', got {missing!r}")
  scores = np.asarray(token_scores)
  if scores.ndim != 2:
    raise ValueError(f"token_scores must have shape [L, T], got {list(scores.shape)}")
  if scores.dtype.kind not in "fiu":
    raise ValueError(f"token_scores must be numeric, got dtype {scores.dtype}")
  ids = np.asarray(word_ids)
  if ids.shape != (scores.shape[0],):
    raise ValueError(f"word_ids must have shape [{scores.shape[0]}] (one per token row), "
                     f"got {list(ids.shape)}")
  if ids.size and ids.dtype.kind not in "iu":
    if ids.dtype.kind != "f" or not np.isfinite(ids).all() or (ids != np.round(ids)).any():
      raise ValueError(f"word_ids must be integers, got dtype {ids.dtype}")
  ids = ids.astype(np.int64)
  num_words = int(num_words)
  if num_words < 0:
    raise ValueError(f"num_words must be >= 0, got {num_words}")
  bad = (ids < -1) | (ids >= num_words)
  if bad.any():
    k = int(np.argmax(bad))
    raise ValueError(f"word_ids[{k}] = {int(ids[k])} is outside [-1, {num_words})")

  dtype = np.result_type(scores.dtype, np.float32)
  num_tags = scores.shape[1]
  out = np.zeros((num_words, num_tags), dtype)
  valid = ids >= 0
  tok = np.flatnonzero(valid)  # token positions that belong to a word
  words = ids[valid]
  counts = np.bincount(words, minlength=num_words)  # [W]
  if reduce == "first":
    # np.unique returns the first occurrence in token order for each word.
    uniq, first = np.unique(words, return_index=True)
    out[uniq] = scores[tok[first]]
  else:
    np.add.at(out, words, scores[tok].astype(dtype))
    covered = counts > 0
    out[covered] /= counts[covered, None]
  absent = np.flatnonzero(counts == 0)
  if absent.size:
    if missing == "error":
      shown = absent[:10].tolist()
      more = f" and {absent.size - 10} more" if absent.size > 10 else ""
      raise ValueError(f"{absent.size} of {num_words} words have no token: {shown}{more}")
    out[absent] = LOG_ZERO  # certainly `O` (tag id 0)
    out[absent, 0] = 0.0
  return out


# ---------------------------------------------------------------- entities
@dataclasses.dataclass(frozen=True)
class PredictedEntity:
  """An entity read from word tags.

  Attributes:
    label: entity label (the tag without its prefix).
    words: sorted indices of its (consecutive) words in the document.
    text: its words joined by single spaces.
    box: `(x0, y0, x1, y1)`, the union of its words' boxes in page pixels, on
      `page`. An entity whose words run over several pages keeps all of its
      words but gets the box and page of its first (lowest) page only: a box
      union across pages means nothing in page pixels.
    page: the page of `box`.
    score: mean over its words of the softmax probability of the word's
      chosen tag, or None when no scores were given.
  """
  label: str
  words: tuple[int, ...]
  text: str
  box: tuple[float, float, float, float]
  page: int
  score: float | None = None


def entities_from_word_tags(doc: Document, word_tags: Sequence[str], scheme: str = "BIOES",
                            word_scores=None, *, tag_names: Sequence[str] | None = None,
                            lenient: bool = False) -> list[PredictedEntity]:
  """Entities (with text, box, page and confidence) from one tag per word.

  Args:
    doc: the document the tags belong to.
    word_tags: `len(doc)` tag strings.
    scheme: "BIOES" or "BIO".
    word_scores: optional `[W, T]` scores (logits or log-probabilities) for the
      confidence; needs the tag vocabulary, `tag_names` or else
      `tag_names(doc.label_set, scheme)`.
    tag_names: the columns of `word_scores`.
    lenient: by default an ill-formed tag sequence (e.g. `O I-x`) is an error,
      since its broken chunks would be dropped. With `lenient=True` it is read
      as seqeval's strict mode reads it: only well-formed chunks become entities.

  Returns:
    The entities in reading order.

  Raises:
    DocumentError: wrong number of tags or score rows, malformed or (unless
      `lenient`) ill-formed tags, tags missing from the vocabulary.
  """
  scheme = tagging.check_scheme(scheme)
  n = len(doc)

  def err(msg, field):
    return DocumentError(msg, doc_id=doc.id, field=field)

  if isinstance(word_tags, str):
    raise err("must be a sequence of tag strings, got a single string", "word_tags")
  word_tags = list(word_tags)
  if len(word_tags) != n:
    raise err(f"has {len(word_tags)} tags for {n} words", "word_tags")
  for i, t in enumerate(word_tags):
    try:
      p, _ = tagging.split_tag(t)
    except (ValueError, AttributeError, TypeError):
      raise err(f"word {i} has malformed tag {t!r}", "word_tags") from None
    if scheme == "BIO" and p in ("E", "S"):
      raise err(f"word {i} has tag {t!r}, which the BIO scheme does not use", "word_tags")
  if not lenient:
    bad = first_invalid_transition(word_tags, scheme)
    if bad is not None:
      where = ("the sequence ends inside an entity" if bad == n else
               f"tag {word_tags[bad]!r} at word {bad} may not follow "
               f"{word_tags[bad - 1] if bad else 'the start'!r}")
      raise err(f"ill-formed {scheme} sequence: {where} (decode with Viterbi, or pass "
                "lenient=True to keep only well-formed chunks)", "word_tags")

  probs = None
  if word_scores is not None:
    probs = _chosen_tag_probs(doc, word_tags, word_scores, tag_names, scheme, err)

  entities = []
  for label, begin, stop in tagging.tags_to_spans(word_tags, scheme):
    words = tuple(range(begin, stop))
    score = float(np.mean(probs[begin:stop])) if probs is not None else None
    entities.append(_make_entity(doc, label, words, score))
  return entities


def _chosen_tag_probs(doc, word_tags, word_scores, tag_names, scheme, err) -> np.ndarray:
  """`[W]` softmax probability of each word's tag under `word_scores`."""
  if tag_names is None:
    if doc.label_set is None:
      raise err("word_scores given without tag_names, and the document has no label_set "
                "to derive them from", "word_scores")
    tag_names = tagging.tag_names(doc.label_set, scheme)
  column = {t: k for k, t in enumerate(tag_names)}
  scores = _checked_word_scores(doc, word_scores, len(column))
  try:
    chosen = np.array([column[t] for t in word_tags], np.int64)
  except KeyError as e:
    raise err(f"tag {e.args[0]!r} is not in tag_names", "word_tags") from None
  logp = _log_softmax(scores)  # [W, T]
  return np.exp(logp[np.arange(len(doc)), chosen])


def _checked_word_scores(doc: Document, word_scores, num_tags: int) -> np.ndarray:
  """`word_scores` as float64 `[W, T]`, or a `DocumentError` saying what is wrong."""
  scores = np.asarray(word_scores)
  problem = None
  if scores.shape != (len(doc), num_tags):
    problem = (f"must have shape [{len(doc)}, {num_tags}] (words, tags), got "
               f"{list(scores.shape)}")
  elif scores.dtype.kind not in "fiu":
    problem = f"must be numeric, got dtype {scores.dtype}"
  elif np.isnan(scores.astype(np.float64)).any() or (scores == np.inf).any():
    problem = "contains NaN or +inf"
  if problem:
    raise DocumentError(problem, doc_id=doc.id, field="word_scores")
  return scores.astype(np.float64)


def _log_softmax(x: np.ndarray) -> np.ndarray:
  """Row-wise log-softmax, exact for rows holding -inf (not all of them)."""
  x = np.maximum(x, LOG_ZERO)  # -inf -> finite, so no inf - inf
  x = x - x.max(axis=-1, keepdims=True)
  return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _make_entity(doc: Document, label: str, words: tuple[int, ...],
                 score: float | None) -> PredictedEntity:
  idx = np.asarray(words, np.int64)
  pages = doc.pages[idx]
  page = int(pages.min())
  boxes = doc.boxes[idx[pages == page]]  # [k, 4], the words on the first page
  box = (float(boxes[:, 0].min()), float(boxes[:, 1].min()),
         float(boxes[:, 2].max()), float(boxes[:, 3].max()))
  text = " ".join(doc.words[i] for i in words)
  return PredictedEntity(label=label, words=tuple(int(i) for i in words), text=text, box=box,
                         page=page, score=score)


def word_tags_from_entities(doc: Document, entities, scheme: str = "BIOES",
                            labels=None) -> list[str]:
  """One tag per word from entities (`Entity`, `PredictedEntity`, anything with
  `.label` and `.words`).

  An entity whose words are not consecutive is tagged as its maximal runs of
  consecutive words (see `flaxdoc.tags.entities_to_tags`). `labels`: the labels the
  entities may have (default `doc.label_set`, when the document has one); a model's
  predictions pass the model's labels, whatever the document's own set says.

  Raises:
    DocumentError: a word index out of range, a word in two entities, an empty
      entity, or a label outside `labels`.
  """
  scheme = tagging.check_scheme(scheme)
  labels = doc.label_set if labels is None else tuple(labels)
  n = len(doc)
  owner: dict[int, int] = {}
  for k, e in enumerate(entities or ()):
    label, words = getattr(e, "label", None), getattr(e, "words", None)
    if not isinstance(label, str) or not label or words is None:
      raise DocumentError(f"entity {k} ({e!r}) needs a non-empty .label and .words",
                          doc_id=doc.id, field="entities")
    if labels is not None and label not in labels:
      raise DocumentError(f"entity {k} has unknown label {label!r} "
                          f"(known: {list(labels)})", doc_id=doc.id, field="entities")
    if not len(words):
      raise DocumentError(f"entity {k} ({label}) has no words", doc_id=doc.id, field="entities")
    for i in words:
      if not 0 <= int(i) < n:
        raise DocumentError(f"entity {k} ({label}) refers to word {int(i)}, but there are "
                            f"{n} words", doc_id=doc.id, field="entities")
      if int(i) in owner:
        raise DocumentError(f"word {int(i)} belongs to entities {owner[int(i)]} and {k}",
                            doc_id=doc.id, field="entities")
      owner[int(i)] = k
  return tagging.entities_to_tags(n, entities, scheme)


# ---------------------------------------------------------------- one document
@functools.lru_cache(maxsize=64)
def _cached_transitions(tag_names: tuple[str, ...], scheme: str):
  return allowed_transitions(tag_names, scheme)


def decode_document(doc: Document, word_scores, tag_names: Sequence[str],
                    scheme: str = "BIOES") -> list[PredictedEntity]:
  """Constrained Viterbi over a document's word scores, then entity assembly.

  Args:
    doc: the document.
    word_scores: `[W, T]` logits or log-probabilities per word (e.g. from
      `word_scores_from_tokens`). They are log-softmax-normalised first, so the
      decoded sequence maximises the product of per-word tag probabilities.
    tag_names: the `T` tags of the columns.
    scheme: "BIOES" or "BIO".

  Returns:
    The predicted entities in reading order, with confidences.

  Raises:
    DocumentError: shapes disagree with the document or the vocabulary, or the
      scores hold NaN / +inf.
  """
  scheme = tagging.check_scheme(scheme)
  tag_names = tuple(tag_names)
  trans, start, end = _cached_transitions(tag_names, scheme)
  scores = _checked_word_scores(doc, word_scores, len(tag_names))
  if not len(doc):
    return []
  logp = _log_softmax(scores)  # [W, T]
  path, _ = viterbi_numpy(logp, trans, start, end)
  word_tags = [tag_names[t] for t in path]
  return entities_from_word_tags(doc, word_tags, scheme, logp, tag_names=tag_names)
