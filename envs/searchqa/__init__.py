"""SearchQA data: a generated fictional world, its corpus and questions, and Search-R1 file formats.

``world``: entities and passages from a seed; ``questions``: single-hop, multi-hop and no-search
questions with gold answers and passages; ``data``: corpus jsonl, Search-R1 parquet, FlashRAG
conversion and the bundled dataset.
"""

from agentgym.envs.searchqa.data import (
    SEARCH_R1_TEST_DATASETS, SEARCH_R1_TRAIN_DATASETS, DatasetFormatError, bundled_dataset,
    find_flashrag_files, load_corpus_jsonl, load_flashrag_jsonl, load_search_r1_parquet, prepare_flashrag,
    save_corpus_jsonl, save_search_r1_parquet, split_title, to_search_r1_rows,
)
from agentgym.envs.searchqa.questions import (
    DEFAULT_MIX, QUESTION_TYPES, entity_split, make_questions, question_pool_sizes,
)
from agentgym.envs.searchqa.world import WORLD_SIZES, Entity, World, build_world
from agentgym.envs.searchqa.render import Passage

__all__ = [
    "World", "Entity", "Passage", "build_world", "WORLD_SIZES",
    "make_questions", "question_pool_sizes", "entity_split", "QUESTION_TYPES", "DEFAULT_MIX",
    "load_corpus_jsonl", "save_corpus_jsonl", "split_title", "bundled_dataset", "to_search_r1_rows",
    "save_search_r1_parquet", "load_search_r1_parquet", "prepare_flashrag", "find_flashrag_files",
    "load_flashrag_jsonl", "DatasetFormatError", "SEARCH_R1_TRAIN_DATASETS", "SEARCH_R1_TEST_DATASETS",
]
