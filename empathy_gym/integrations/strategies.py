"""The ESConv support strategies and their templates moved to :mod:`empathy_gym.strategies`
(the benchmark's ESConv baseline uses them too, and a benchmark must not import an
adapter); this module keeps the old import path working."""

from empathy_gym.strategies import (  # noqa: F401
    PLACEHOLDERS,
    STRATEGIES,
    STRATEGY_DEFINITIONS,
    STRATEGY_NAMES,
    TEMPLATES_DIR,
    StrategyTemplates,
    TemplateError,
    load_templates,
    user_words,
)
