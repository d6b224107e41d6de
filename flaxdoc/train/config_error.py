"""`ConfigError`: a setting the run cannot work with (re-exported as `setup.ConfigError`).

A module of its own so that the train modules `setup` imports (`hf_init`, `linking`, ...)
and those it does not (`optimizer`, `sharding`) raise the one type `flaxdoc.main` prints
as one line, without importing `setup`.
"""


class ConfigError(ValueError):
  """A setting the run cannot work with; the message names the flag that sets it."""
