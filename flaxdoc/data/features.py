"""Featurisation: a `Document` -> fixed-length model windows, and window predictions -> words.

A document is tokenised word by word (each sub-token inherits its word's box,
page and segment; DESIGN §3.3), giving one token sequence for the whole
document. That sequence is cut into windows of at most `max_len` tokens
(including `[CLS]`/`[SEP]`), consecutive windows overlapping by at least
`stride` tokens (when words are short enough; see `window_spans`); cuts
fall between words unless a word is longer than a window. With
`split="page"` the sequence is first split where the page changes, so no
window mixes pages (the LayoutLM "split page" of Douzon et al.), and only
pages longer than a window are windowed further.

Every window is a dict of numpy arrays padded to `max_len` (see `featurize`).
`stitch` is the inverse for predictions: it gives one score row per word, read
at the word's first sub-token in the window where that token is most central
(farthest from a window edge, so with the most context on both sides).

Tags (DESIGN §3.8) are computed per window from the entity spans clipped to
the window, so every window's tag sequence is itself a valid BIOES/BIO
sequence even when a window edge cuts an entity (the model cannot see beyond
its window, so the clipped piece is an entity from its point of view).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Sequence

import numpy as np

from flaxdoc import tags as tags_lib
from flaxdoc.data.document import Document, DocumentError

SPLITS = ("window", "page")

# Keys of every window dict; graph keys are added when `FeatureConfig.graph` is set.
WINDOW_KEYS = ("input_ids", "word_ids", "subtoken_index", "boxes", "page_ids", "segment_ids",
               "positions", "attention_mask", "tags", "token_in_segment", "window_index",
               "window_start")
GRAPH_KEYS = ("neighbor_ids", "neighbor_features", "neighbor_mask")

# Box given to the special tokens (LayoutLM convention).
CLS_BOX = (0, 0, 0, 0)
SEP_BOX = (1000, 1000, 1000, 1000)


@dataclasses.dataclass(frozen=True)
class FeatureConfig:
  """How documents become windows.

  Attributes:
    max_len: tokens per window, specials included; every array is padded to it.
    stride: the minimum overlap, in tokens, between consecutive windows of one
      span (0: windows just tile the sequence). Must be smaller than the
      window's content length. None: a quarter of it (127 for max_len=512).
    split: "window" (window the whole document) or "page" (split where the page
      changes, then window long pages).
    scheme: "BIOES" or "BIO".
    label_all_subtokens: tag every sub-token (B/S on a word's first sub-token,
      I/E on the rest so the token sequence is valid), or only the first
      sub-token of each word (the others get -1, ignored by the loss).
    labels: the entity labels, in tag-vocabulary order. Empty: no tagging
      (`tags` is all -1), e.g. for pre-training.
    add_special_tokens: put `[CLS]` first and `[SEP]` last in every window.
    graph: add the beta-skeleton neighbour arrays (FormNet Super-Tokens).
    graph_max_degree: neighbours kept per token.
    graph_variant: graph construction, passed to `token_neighbours`.
  """
  max_len: int = 512
  stride: int | None = None
  split: str = "window"
  scheme: str = "BIOES"
  label_all_subtokens: bool = False
  labels: tuple[str, ...] = ()
  add_special_tokens: bool = True
  graph: bool = False
  graph_max_degree: int = 8
  graph_variant: str = "ball_of_sight"

  def __post_init__(self):
    labels = self.labels
    if isinstance(labels, str):
      raise ValueError(f"FeatureConfig.labels must be a sequence of labels, got the string "
                       f"{labels!r}")
    object.__setattr__(self, "labels", tuple(str(l) for l in labels))
    object.__setattr__(self, "scheme", tags_lib.check_scheme(self.scheme))
    if len(set(self.labels)) != len(self.labels):
      raise ValueError(f"FeatureConfig.labels has duplicates: {list(self.labels)}")
    if self.split not in SPLITS:
      raise ValueError(f"FeatureConfig.split must be one of {SPLITS}, got {self.split!r}")
    if (isinstance(self.max_len, bool) or not isinstance(self.max_len, (int, np.integer)) or
        self.content_len < 1):
      raise ValueError(f"FeatureConfig.max_len={self.max_len!r} leaves no room for content "
                       f"(specials take {self.num_specials})")
    if self.stride is None:
      object.__setattr__(self, "stride", self.content_len // 4)
    if (isinstance(self.stride, bool) or not isinstance(self.stride, (int, np.integer)) or
        not 0 <= self.stride < self.content_len):
      raise ValueError(f"FeatureConfig.stride={self.stride!r} must be in [0, {self.content_len}) "
                       f"(the content length of a window of max_len={self.max_len})")
    if self.graph and self.graph_max_degree < 1:
      raise ValueError(f"FeatureConfig.graph_max_degree must be >= 1, got {self.graph_max_degree}")

  @property
  def num_specials(self) -> int:
    return 2 if self.add_special_tokens else 0

  @property
  def content_len(self) -> int:
    """Document tokens per window (max_len minus the specials)."""
    return int(self.max_len) - self.num_specials

  @property
  def tag_names(self) -> list[str]:
    return tags_lib.tag_names(self.labels, self.scheme)

  @property
  def num_tags(self) -> int:
    return len(self.tag_names)


# --------------------------------------------------------------------------- tokenisation
@dataclasses.dataclass(frozen=True)
class TokenizedDocument:
  """A document's whole token sequence (before windowing).

  Attributes:
    input_ids: `int32 [T]` sub-token ids.
    word_ids: `int32 [T]` word of each token (non-decreasing).
    subtoken_index: `int32 [T]` index of the token inside its word.
    word_start: `int32 [N]` first token of each word; `word_start[N]` = T.
  """
  input_ids: np.ndarray
  word_ids: np.ndarray
  subtoken_index: np.ndarray
  word_start: np.ndarray

  def __len__(self) -> int:
    return int(self.input_ids.shape[0])


def tokenize_document(doc: Document, tokenizer) -> TokenizedDocument:
  """Encodes every word (memoised per tokenizer) and checks the ids are in range."""
  encode = tokenizer.encode_word
  pieces = [encode(w) for w in doc.words]
  lengths = np.fromiter(map(len, pieces), np.int64, len(pieces))
  if (lengths == 0).any():
    i = int(np.argmin(lengths))
    raise ValueError(f"tokenizer {getattr(tokenizer, 'name', tokenizer)!r} returned no token for "
                     f"word {i} ({doc.words[i]!r}) of document {doc.id!r}; encode_word must "
                     "never be empty")
  ids = np.fromiter(itertools.chain.from_iterable(pieces), np.int64, int(lengths.sum()))
  vocab = int(tokenizer.vocab_size)
  if ids.min() < 0 or ids.max() >= vocab:
    bad = int(np.flatnonzero((ids < 0) | (ids >= vocab))[0])
    word = int(np.searchsorted(np.cumsum(lengths), bad, side="right"))
    raise ValueError(f"tokenizer {getattr(tokenizer, 'name', tokenizer)!r} gave id {int(ids[bad])} "
                     f"outside its vocabulary of {vocab} for word {word} ({doc.words[word]!r}) of "
                     f"document {doc.id!r}")
  starts = np.zeros(len(pieces) + 1, np.int64)
  np.cumsum(lengths, out=starts[1:])
  word_ids = np.repeat(np.arange(len(pieces)), lengths)
  sub = np.arange(len(ids)) - starts[word_ids]
  return TokenizedDocument(ids.astype(np.int32), word_ids.astype(np.int32), sub.astype(np.int32),
                           starts.astype(np.int32))


# --------------------------------------------------------------------------- windows
def window_spans(word_ids: np.ndarray, run_start: int, run_end: int, content_len: int,
                 stride: int) -> list[tuple[int, int]]:
  """Token spans `[start, end)` covering `[run_start, run_end)` with windows of `content_len`.

  Windows hold whole words; only a word longer than `content_len` is cut (into
  pieces of `content_len` tokens). Each window is the longest run of whole
  words from its start; the next one starts at the latest word start that
  keeps at least `stride` tokens of overlap, moved right if needed so that it
  reaches past the previous window's end. Hence every window adds new tokens,
  and the overlap is at least `stride` whenever
  `content_len - stride >= 2 * longest_word - 1` (in tokens).
  """
  if run_end <= run_start:
    return []
  seg = word_ids[run_start:run_end]
  word_starts = run_start + np.concatenate([[0], np.flatnonzero(seg[1:] != seg[:-1]) + 1])
  word_ends = np.concatenate([word_starts[1:], [run_end]])
  long_words = np.flatnonzero(word_ends - word_starts > content_len)
  if len(long_words):  # cut words longer than a window into window-sized units
    pieces = [np.arange(word_starts[i], word_ends[i], content_len) for i in long_words]
    word_starts = np.union1d(word_starts, np.concatenate(pieces))
  bounds = np.concatenate([word_starts, [run_end]])  # units i: [bounds[i], bounds[i + 1])
  num_units = len(bounds) - 1
  spans = []
  u = 0
  while True:
    # Greedy: the last unit boundary within content_len tokens of the start.
    v = int(np.searchsorted(bounds, bounds[u] + content_len, side="right")) - 1
    spans.append((int(bounds[u]), int(bounds[v])))
    if v >= num_units:
      return spans
    # Latest start with >= stride tokens of overlap, but after u and early enough
    # that the next window can take unit v (so it reaches past this one).
    nxt = int(np.searchsorted(bounds, bounds[v] - stride, side="right")) - 1
    reach = int(np.searchsorted(bounds, bounds[v + 1] - content_len, side="left"))
    u = max(nxt, u + 1, reach)


def _page_runs(doc: Document, tok: TokenizedDocument) -> list[tuple[int, int]]:
  """Token ranges of maximal runs of consecutive words on the same page."""
  pages = doc.pages
  cuts = np.flatnonzero(pages[1:] != pages[:-1]) + 1  # word indices where the page changes
  bounds = np.concatenate([[0], cuts, [len(doc)]])
  ws = tok.word_start
  return [(int(ws[a]), int(ws[b])) for a, b in zip(bounds[:-1], bounds[1:])]


# --------------------------------------------------------------------------- tags
@dataclasses.dataclass(frozen=True)
class _WordRuns:
  """Per word: label index of its entity run (-1: none) and the run's word range."""
  label: np.ndarray  # int64 [N]
  start: np.ndarray  # int64 [N] first word of the run
  end: np.ndarray    # int64 [N] one past the last word of the run


def _entity_runs(doc: Document, config: FeatureConfig) -> _WordRuns | None:
  """The runs of consecutive words of one entity (what `tags.entities_to_tags` tags).

  None when nothing is to be tagged (no labels configured, or an unlabelled
  document). Raises `DocumentError` for labels outside `config.labels`.
  """
  if not config.labels or doc.entities is None:
    return None
  index = {l: i for i, l in enumerate(config.labels)}
  n = len(doc)
  label = np.full(n, -1, np.int64)
  owner = np.full(n, -1, np.int64)
  for k, e in enumerate(doc.entities):
    if e.label not in index:
      raise DocumentError(f"entity {k} has label {e.label!r}, which is not in the configured "
                          f"labels {list(config.labels)}", doc_id=doc.id, field="entities")
    words = np.asarray(e.words, np.int64)
    label[words] = index[e.label]
    owner[words] = k
  # A run ends where the owning entity changes (entities never share words, and a
  # non-contiguous entity is split by the words in between).
  new_run = np.concatenate([[True], owner[1:] != owner[:-1]])
  run_id = np.cumsum(new_run) - 1
  starts = np.flatnonzero(new_run)
  ends = np.concatenate([starts[1:], [n]])
  return _WordRuns(label, starts[run_id], ends[run_id])


def _tag_ids(label: np.ndarray, i: np.ndarray, n: np.ndarray, scheme: str) -> np.ndarray:
  """Tag id of position `i` in a span of length `n` of `label` (all arrays; label >= 0)."""
  if scheme == "BIO":
    return 1 + 2 * label + (i > 0)
  # Offsets inside a label's block B, I, E, S (see `flaxdoc.tags.tag_names`).
  offset = np.where(n == 1, 3, np.where(i == 0, 0, np.where(i == n - 1, 2, 1)))
  return 1 + 4 * label + offset


def _window_tags(runs: _WordRuns | None, tok: TokenizedDocument, start: int, end: int,
                 config: FeatureConfig) -> np.ndarray:
  """Tag ids of the tokens `[start, end)`: entity runs clipped to the window.

  With all sub-tokens labelled, a run's span is its tokens inside the window;
  otherwise it is its words whose first sub-token is inside the window, and
  the other sub-tokens get -1.
  """
  n_tok = end - start
  if runs is None:
    return np.full(n_tok, -1, np.int32)
  words = tok.word_ids[start:end]
  label = runs.label[words]
  ws = tok.word_start
  if config.label_all_subtokens:
    a = np.maximum(ws[runs.start[words]], start)  # clipped run, in tokens
    b = np.minimum(ws[runs.end[words]], end)
    i = np.arange(start, end) - a
  else:
    first_word = int(np.searchsorted(ws[:-1], start))  # words whose first token is inside
    end_word = int(np.searchsorted(ws[:-1], end))
    a = np.maximum(runs.start[words], first_word)  # clipped run, in words
    b = np.minimum(runs.end[words], end_word)
    i = words - a
  tags = np.where(label >= 0, _tag_ids(np.maximum(label, 0), i, b - a, config.scheme), 0)
  if not config.label_all_subtokens:
    tags = np.where(tok.subtoken_index[start:end] == 0, tags, -1)
  return tags.astype(np.int32)


# --------------------------------------------------------------------------- per-word tables
def _token_in_segment(segments: np.ndarray) -> np.ndarray:
  """Index of each word among the words of its segment, in document order."""
  n = len(segments)
  order = np.argsort(segments, kind="stable")
  s = segments[order]
  starts = np.concatenate([[0], np.flatnonzero(s[1:] != s[:-1]) + 1])
  sizes = np.diff(np.concatenate([starts, [n]]))
  rank = np.arange(n) - np.repeat(starts, sizes)
  out = np.empty(n, np.int32)
  out[order] = rank
  return out


def _first_appearance_ids(values: np.ndarray) -> np.ndarray:
  """Relabels values 0, 1, 2... in order of first appearance."""
  if not len(values):
    return values.astype(np.int32)
  _, first, inverse = np.unique(values, return_index=True, return_inverse=True)
  rank = np.empty(len(first), np.int32)
  rank[np.argsort(first)] = np.arange(len(first), dtype=np.int32)
  return rank[inverse.reshape(-1)]


def document_word_boxes(doc: Document) -> np.ndarray:
  """`float32 [N, 4]` LayoutLM boxes with pages stacked vertically (y + 1000 * page, DESIGN §2)."""
  boxes = doc.normalized_boxes().astype(np.float32)
  boxes[:, [1, 3]] += 1000.0 * doc.pages[:, None].astype(np.float32)
  return boxes


def _graph(doc: Document, tok: TokenizedDocument, config: FeatureConfig) -> dict[str, np.ndarray]:
  from flaxdoc.layout.token_graph import token_neighbours  # pylint: disable=import-outside-toplevel
  g = token_neighbours(document_word_boxes(doc), tok.word_ids, max_degree=config.graph_max_degree,
                       variant=config.graph_variant)
  ids = np.asarray(g["neighbor_ids"])
  feats = np.asarray(g["neighbor_features"], np.float32)
  mask = np.asarray(g["neighbor_mask"]).astype(bool)
  t = len(tok)
  if ids.ndim != 2 or ids.shape[0] != t or mask.shape != ids.shape or feats.shape[:2] != ids.shape:
    raise ValueError(f"token_neighbours returned shapes {ids.shape}, {feats.shape}, {mask.shape} "
                     f"for {t} tokens")
  if mask.any() and (ids[mask].min() < 0 or ids[mask].max() >= t):
    raise ValueError("token_neighbours returned neighbour ids outside the token sequence")
  if not np.isfinite(feats).all():
    raise ValueError(f"token_neighbours returned non-finite edge features for {doc.id!r}")
  return {"neighbor_ids": ids, "neighbor_features": feats, "neighbor_mask": mask}


# --------------------------------------------------------------------------- featurize
def featurize(doc: Document, tokenizer, config: FeatureConfig) -> list[dict[str, np.ndarray]]:
  """Turns one document into model windows (a list of dicts of numpy arrays).

  Each window has, padded to `L = config.max_len` (pad rows noted):
    input_ids       int32 [L]     sub-token ids (`pad_id`).
    word_ids        int32 [L]     index of the token's word in `doc` (-1: special, pad).
    subtoken_index  int32 [L]     index of the token inside its word (-1).
    boxes           int32 [L, 4]  the word's LayoutLM box; `[CLS]` 0s, `[SEP]` 1000s (0s).
    page_ids        int32 [L]     page of the word; specials take their neighbour's (0).
    segment_ids     int32 [L]     OCR segment, renumbered 0.. by first appearance in
                                  the window (-1).
    positions       int32 [L]     1D position ids 0..L-1.
    attention_mask  int32 [L]     1 for real tokens (specials included), 0 for padding.
    tags            int32 [L]     tag id in `config.tag_names` (-1: ignored).
    token_in_segment int32 [L]    index of the word inside its OCR segment (-1), for 1-LOP.
    window_index    int32 []      index of the window in the list.
    window_start    int32 []      offset of the window's first content token in the
                                  document's token sequence.
  and with `config.graph`: `neighbor_ids int32 [L, K]` (window positions),
  `neighbor_features float32 [L, K, F]`, `neighbor_mask bool [L, K]`; the
  graph is built once over the whole document and neighbours outside the
  window are masked.

  Raises:
    DocumentError: the document has no words or an entity label outside
      `config.labels`.
    ValueError: the tokenizer returned an empty or out-of-vocabulary encoding.
  """
  if not isinstance(doc, Document):
    raise TypeError(f"featurize expects a Document, got {type(doc).__name__}")
  if not isinstance(config, FeatureConfig):
    raise TypeError(f"featurize expects a FeatureConfig, got {type(config).__name__}")
  if len(doc) == 0:
    raise DocumentError("has no words; nothing to featurise", doc_id=doc.id, field="words")
  runs = _entity_runs(doc, config)
  tok = tokenize_document(doc, tokenizer)
  word_boxes = doc.normalized_boxes()  # [N, 4]
  word_tis = _token_in_segment(doc.segments)
  graph = _graph(doc, tok, config) if config.graph else None

  if config.split == "page":
    spans = [s for a, b in _page_runs(doc, tok)
             for s in window_spans(tok.word_ids, a, b, config.content_len, config.stride)]
  else:
    spans = window_spans(tok.word_ids, 0, len(tok), config.content_len, config.stride)

  L = int(config.max_len)
  off = 1 if config.add_special_tokens else 0
  windows = []
  for k, (start, end) in enumerate(spans):
    n = end - start
    sl = slice(off, off + n)
    words = tok.word_ids[start:end]  # [n]
    w = {}
    ids = np.full(L, tokenizer.pad_id, np.int32)
    ids[sl] = tok.input_ids[start:end]
    word_ids = np.full(L, -1, np.int32)
    word_ids[sl] = words
    sub = np.full(L, -1, np.int32)
    sub[sl] = tok.subtoken_index[start:end]
    boxes = np.zeros((L, 4), np.int32)
    boxes[sl] = word_boxes[words]
    pages = np.zeros(L, np.int32)
    pages[sl] = doc.pages[words]
    segs = np.full(L, -1, np.int32)
    segs[sl] = _first_appearance_ids(doc.segments[words])
    tis = np.full(L, -1, np.int32)
    tis[sl] = word_tis[words]
    tags = np.full(L, -1, np.int32)
    tags[sl] = _window_tags(runs, tok, start, end, config)
    mask = np.zeros(L, np.int32)
    mask[:n + 2 * off] = 1
    if off:
      ids[0], ids[n + 1] = tokenizer.cls_id, tokenizer.sep_id
      boxes[0], boxes[n + 1] = CLS_BOX, SEP_BOX
      pages[0], pages[n + 1] = pages[1], pages[n]
    w["input_ids"] = ids
    w["word_ids"] = word_ids
    w["subtoken_index"] = sub
    w["boxes"] = boxes
    w["page_ids"] = pages
    w["segment_ids"] = segs
    w["positions"] = np.arange(L, dtype=np.int32)
    w["attention_mask"] = mask
    w["tags"] = tags
    w["token_in_segment"] = tis
    w["window_index"] = np.asarray(k, np.int32)
    w["window_start"] = np.asarray(start, np.int32)
    if graph is not None:
      w.update(_window_graph(graph, start, end, off, L))
    windows.append(w)
  return windows


def _window_graph(graph: dict[str, np.ndarray], start: int, end: int, off: int,
                  L: int) -> dict[str, np.ndarray]:
  """The document graph's rows `[start, end)`, re-indexed to window positions."""
  n = end - start
  k = graph["neighbor_ids"].shape[1]
  f = graph["neighbor_features"].shape[2]
  doc_ids = graph["neighbor_ids"][start:end]  # [n, K] document token indices
  keep = graph["neighbor_mask"][start:end] & (doc_ids >= start) & (doc_ids < end)
  ids = np.zeros((L, k), np.int32)
  ids[off:off + n] = np.where(keep, doc_ids - start + off, 0)
  feats = np.zeros((L, k, f), np.float32)
  feats[off:off + n] = np.where(keep[..., None], graph["neighbor_features"][start:end], 0.0)
  mask = np.zeros((L, k), bool)
  mask[off:off + n] = keep
  return {"neighbor_ids": ids, "neighbor_features": feats, "neighbor_mask": mask}


# --------------------------------------------------------------------------- inverse and batching
def stitch(doc: Document, windows: Sequence[dict[str, np.ndarray]],
           token_scores: Sequence[np.ndarray]) -> np.ndarray:
  """Window predictions `[L, C]` -> one row per word, `[num_words, C]`.

  A word's row is read at its first sub-token, in the window where that token
  is most central (largest distance, in content tokens, to the nearer window
  edge); ties go to the earlier window. Raises `ValueError` if a word has no
  first sub-token in any window (an incomplete window list) or shapes differ.
  """
  if len(windows) != len(token_scores):
    raise ValueError(f"stitch: {len(windows)} windows but {len(token_scores)} score arrays")
  n_words = len(doc)
  out = None
  best = np.full(n_words, -1, np.int64)
  for k, (win, scores) in enumerate(zip(windows, token_scores)):
    scores = np.asarray(scores)
    word_ids = np.asarray(win["word_ids"])
    if scores.ndim != 2 or scores.shape[0] != word_ids.shape[0]:
      raise ValueError(f"stitch: window {k} has {word_ids.shape[0]} tokens but scores of shape "
                       f"{list(scores.shape)} (expected [L, C])")
    if out is None:
      out = np.zeros((n_words, scores.shape[1]), scores.dtype)
    elif scores.shape[1] != out.shape[1]:
      raise ValueError(f"stitch: window {k} has {scores.shape[1]} score columns, not "
                       f"{out.shape[1]}")
    real = word_ids >= 0
    if real.any() and word_ids.max() >= n_words:
      raise ValueError(f"stitch: window {k} refers to word {int(word_ids.max())}, but document "
                       f"{doc.id!r} has {n_words} words")
    pos = np.cumsum(real) - 1  # content position of each real token
    n = int(real.sum())
    idx = np.flatnonzero(real & (np.asarray(win["subtoken_index"]) == 0))
    words = word_ids[idx]
    centrality = np.minimum(pos[idx], n - 1 - pos[idx])
    better = centrality > best[words]
    out[words[better]] = scores[idx[better]]
    best[words[better]] = centrality[better]
  missing = np.flatnonzero(best < 0)
  if len(missing):
    raise ValueError(f"stitch: {len(missing)} words of document {doc.id!r} have no first sub-token "
                     f"in the windows (first missing: {missing[:10].tolist()})")
  return out


def batch_features(windows: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """Stacks window dicts into one batch dict (`[B, ...]` per key)."""
  if not windows:
    raise ValueError("batch_features: no windows to batch")
  keys = list(windows[0])
  for i, w in enumerate(windows):
    if set(w) != set(keys):
      raise ValueError(f"batch_features: window {i} has keys {sorted(w)}, window 0 has "
                       f"{sorted(keys)}")
  out = {}
  for key in keys:
    arrays = [np.asarray(w[key]) for w in windows]
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
      raise ValueError(f"batch_features: key {key!r} has different shapes {sorted(shapes)} "
                       "(windows featurised with different max_len?)")
    out[key] = np.stack(arrays)
  return out

