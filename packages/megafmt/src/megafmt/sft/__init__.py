"""Supervised fine-tuning data: jsonl conversations, their line index, the SFT tokenizer's
prompt formats, and the pre-tokenized form (``mega preprocess --sft``).

numpy and fsspec only, like the rest of megafmt; the tokenizer needs ``tokenizers``
(``transformers`` for the ``default`` prompt format). The dataset that packs conversations into
samples is megaindex's ``SFTDataset``.
"""

# the error a bad line raises, naming its file and line (as preprocessing's bad lines do)
from megafmt.errors import BadInputError
from megafmt.sft.lines import JsonlLineIndex
from megafmt.sft.messages import (
    conversation_problem,
    line_problem,
    messages_problem,
    split_conversations,
)
from megafmt.sft.show import describe_tokens, loss_runs
from megafmt.sft.tokenized import (
    TokenizedConversations,
    check_vocabulary,
    get_loss_mask_path,
    preprocess_sft,
    write_tokenized,
)
from megafmt.sft.tokenizer import (
    DEFAULT_PROMPT_FORMAT,
    IGNORE_INDEX,
    PROMPT_FORMATS,
    SFTTokenizer,
    tokenize_line,
)

__all__ = [
    "DEFAULT_PROMPT_FORMAT",
    "IGNORE_INDEX",
    "PROMPT_FORMATS",
    "BadInputError",
    "JsonlLineIndex",
    "SFTTokenizer",
    "TokenizedConversations",
    "check_vocabulary",
    "conversation_problem",
    "describe_tokens",
    "get_loss_mask_path",
    "line_problem",
    "loss_runs",
    "messages_problem",
    "preprocess_sft",
    "split_conversations",
    "tokenize_line",
    "write_tokenized",
]
