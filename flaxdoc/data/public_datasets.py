"""What flaxdoc knows of the public benchmarks before reading them: their label sets,
and the error raised when a local copy or one of its splits is missing.

The readers (`flaxdoc.data.{funsd,cord,sroie}`, `flaxdoc.data.reading`) and the
entry point `flaxdoc.data.datasets` (which re-exports both names) import this module;
it imports none of them, so the readers need not import the entry point that loads
them.
"""

from __future__ import annotations

# The label sets, in tag-vocabulary order (see `flaxdoc.tags.tag_names`).
LABELS: dict[str, tuple[str, ...]] = {
    "funsd": ("header", "question", "answer", "other"),
    # The 30 `valid_line` categories of CORD, spelled as in the data (the authors'
    # README writes `subtotal.*` and `void menu`), grouped by super-category.
    "cord": (
        "menu.nm", "menu.num", "menu.unitprice", "menu.cnt", "menu.discountprice",
        "menu.price", "menu.itemsubtotal", "menu.vatyn", "menu.etc", "menu.sub_nm",
        "menu.sub_unitprice", "menu.sub_cnt", "menu.sub_price", "menu.sub_etc",
        "void_menu.nm", "void_menu.price",
        "sub_total.subtotal_price", "sub_total.discount_price", "sub_total.service_price",
        "sub_total.othersvc_price", "sub_total.tax_price", "sub_total.etc",
        "total.total_price", "total.total_etc", "total.cashprice", "total.changeprice",
        "total.creditcardprice", "total.emoneyprice", "total.menutype_cnt",
        "total.menuqty_cnt",
    ),
    "sroie": ("company", "date", "address", "total"),
}


class DatasetNotFoundError(FileNotFoundError):
  """A dataset directory or split is missing; the message says what layout was expected."""
