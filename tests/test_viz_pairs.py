"""Key -> value arrows in `viz.draw_document`."""

import numpy as np
from PIL import Image

from flaxdoc import viz
from flaxdoc.data.document import Document


def test_arrows_are_drawn_between_linked_entities(tmp_path):
  doc = Document.create("kv", ["Date:", "1.2.20", "Total", "9.00"],
                        [[10, 10, 40, 20], [200, 10, 240, 20], [10, 100, 40, 110],
                         [10, 200, 40, 210]], page_sizes=[[300, 300]],
                        entities=[("key", [0]), ("date", [1]), ("key", [2]), ("total", [3])],
                        relations=[(0, 1), (2, 3)])
  ents = doc.entities
  plain = np.asarray(Image.open(viz.draw_document(doc, tmp_path / "a.png", entities=ents,
                                                  scale=1.0)))
  drawn = np.asarray(Image.open(viz.draw_document(doc, tmp_path / "b.png", entities=ents,
                                                  scale=1.0, pairs=[(ents[0], ents[1]),
                                                                    (ents[2], ents[3])])))
  red = (drawn[..., 0] > 180) & (drawn[..., 1] < 80) & (drawn[..., 2] < 80)
  assert not ((plain[..., 0] > 180) & (plain[..., 1] < 80) & (plain[..., 2] < 80)).any()
  oy = viz.MARGIN + viz.TITLE_HEIGHT
  ox = viz.MARGIN
  # A horizontal arrow on the first line (right of "Date:", left of its value)...
  assert red[oy + 15, ox + 100] and red[oy + 15, ox + 190]
  # ... and a vertical one from "Total" down to its value, nothing in between elsewhere.
  assert red[oy + 150, ox + 25]
  assert not red[oy + 60, ox + 150]
