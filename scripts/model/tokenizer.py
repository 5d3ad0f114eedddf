"""The task-text tokenizer: small, deterministic, dependency-free.

A C++ reimplementation must reproduce this byte for byte. The algorithm:

1. Encode the text as UTF-8 bytes.
2. Lowercase ASCII only: bytes 0x41..0x5A ('A'..'Z') become 0x61..0x7A. No
   other byte changes (no Unicode case folding, no normalization).
3. Split into words: a word is a maximal run of "word bytes", which are ASCII
   digits 0x30..0x39, ASCII lowercase letters 0x61..0x7A, and every byte
   >= 0x80 (so non-ASCII UTF-8 sequences stay inside words). Every other byte
   (ASCII whitespace, punctuation, control) separates words and is dropped.
4. Each word (its bytes after step 2) gets
       id = 4 + fnv1a32(word) % (TOKENIZER_VOCAB - 4),   TOKENIZER_VOCAB = 8192,
   where fnv1a32 starts at h = 0x811C9DC5 and for each byte b does
   h = ((h XOR b) * 0x01000193) mod 2^32.
5. The sequence is [BOS] + word ids + [EOS]. If that exceeds max_len, keep
   only the first max_len - 2 words (BOS and EOS always stay). Then pad with
   PAD to max_len. `length` is the count of non-pad ids (2 + kept words).

Special ids: PAD = 0, BOS = 1, EOS = 2, UNK = 3 (reserved; this algorithm never
emits it). Word ids lie in [4, 8192), so they fit every config's vocabulary.

Golden pairs (max_len 8) are pinned in test/model/test_tokenizer.py.

The word hash is the default of the small configs (n16-tiny's demo and its
CPU parity tests). A checkpoint's own Hugging Face `tokenizer.json` is used
instead through `HFTokenizer` (the `tokenizers` library): the dataset
converter takes it with `--tokenizer PATH` and stores its ids, and the export
takes the same option and records which tokenizer the model was built for.
`record()` of either is the identity both sides write (kind, file, sha256,
vocab_size); the trainer refuses a dataset whose record's kind differs from
the model's, or whose tokenizer.json has another sha256 (Note [Tokenizer
match] in src/data/batch.cpp; the word hash is this fixed algorithm, so its
records match by kind and its sha256, of this file, is informational).

Text form: with `text_form="gr00t_formalized"` (convert_lerobot.py and export.py
`--formalize-language`, or `--formalize-language n17`; N1.7 imports by default) an
HFTokenizer first changes the text as upstream GR00T N1.7's formalize_language does
(lerobot 0.6.1 `prepare_n1_7_language_batch`: an empty text becomes "Perform the
task.", then Python's str.lower(), then only characters with str.isalnum() or
str.isspace() and '_' are kept). With `text_form="gr00t_n16_formalized"`
(`--formalize-language n16`; N1.6 imports by default) it changes it as Isaac-GR00T's
N1.6 processor does (`re.sub(r"[^\\w\\s]", "", text.lower())`: the same characters
kept, an empty text left empty). The record then carries "text_form", and the
trainer refuses a model/dataset pair whose text forms differ.
"""

import hashlib
from pathlib import Path
from typing import Dict, List, Tuple

TOKENIZER_VOCAB = 8192
PAD, BOS, EOS, UNK = 0, 1, 2, 3
FNV_OFFSET = 0x811C9DC5
FNV_PRIME = 0x01000193


def fnv1a32(data: bytes) -> int:
    h = FNV_OFFSET
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFF
    return h


def _is_word_byte(b: int) -> bool:
    return (0x30 <= b <= 0x39) or (0x61 <= b <= 0x7A) or b >= 0x80


def words(text: str) -> List[bytes]:
    """Steps 1-3: the words of text, as lowercased UTF-8 byte strings."""
    data = bytes(b + 0x20 if 0x41 <= b <= 0x5A else b for b in text.encode("utf-8"))
    out: List[bytes] = []
    start = -1
    for i, b in enumerate(data):
        if _is_word_byte(b):
            if start < 0:
                start = i
        elif start >= 0:
            out.append(data[start:i])
            start = -1
    if start >= 0:
        out.append(data[start:])
    return out


def word_id(word: bytes) -> int:
    return 4 + fnv1a32(word) % (TOKENIZER_VOCAB - 4)


def encode(text: str, max_len: int) -> Tuple[List[int], int]:
    """-> (ids padded to max_len, length = number of non-pad ids)."""
    if max_len < 2:
        raise ValueError(f"tokenizer max_len={max_len}: must be >= 2 (room for BOS and EOS)")
    ids = [word_id(w) for w in words(text)][: max_len - 2]
    seq = [BOS] + ids + [EOS]
    length = len(seq)
    return seq + [PAD] * (max_len - length), length


# ---------------------------------------------------------------------------
# Which tokenizer: the word hash above, or a Hugging Face tokenizer.json

WORD_HASH = "word_hash"
HF_TOKENIZER_JSON = "hf_tokenizer_json"


RAW = "raw"
GR00T_FORMALIZED = "gr00t_formalized"          # upstream N1.7's formalize_language
GR00T_N16_FORMALIZED = "gr00t_n16_formalized"  # Isaac-GR00T N1.6's
TEXT_FORMS = (RAW, GR00T_FORMALIZED, GR00T_N16_FORMALIZED)
# --formalize-language's values (convert_lerobot.py, export.py): the upstream whose form the text takes
FORMALIZE_FLAGS = {"n17": GR00T_FORMALIZED, "n16": GR00T_N16_FORMALIZED}
DEFAULT_INSTRUCTION = "Perform the task."   # upstream's text for a sample without one


def formalize(text: str, form: str = GR00T_FORMALIZED) -> str:
    """upstream GR00T N1.7's formalize_language, or N1.6's with form=GR00T_N16_FORMALIZED (module docstring)."""
    text = (text if form == GR00T_N16_FORMALIZED else text or DEFAULT_INSTRUCTION).lower()
    return "".join(ch for ch in text if ch.isalnum() or ch.isspace() or ch == "_")


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def word_hash_record() -> Dict:
    """The identity of the word hash: this file's SHA-256 (the algorithm is this file)."""
    return {"kind": WORD_HASH, "file": "scripts/model/tokenizer.py", "sha256": _sha256(Path(__file__)),
            "vocab_size": TOKENIZER_VOCAB, "pad_id": PAD, "bos_id": BOS, "eos_id": EOS}


class HFTokenizer:
    """A Hugging Face `tokenizer.json` through the `tokenizers` library.

    encode(text, max_len) -> (ids padded with 0 to max_len, length): the ids of
    `Tokenizer.encode(text)` (its post-processor's special tokens included, if it
    adds any), the first max_len of them when longer. The pad value 0 is never
    read: text_mask marks the real ids."""

    def __init__(self, path, text_form: str = RAW):
        if text_form not in TEXT_FORMS:
            raise ValueError(f"text form {text_form!r}: must be one of {TEXT_FORMS}")
        self.text_form = text_form
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise RuntimeError(f"reading {path} needs the `tokenizers` package ({e}); "
                               "pip install -r scripts/requirements.txt") from e
        self.path = Path(path)
        try:
            self.tok = Tokenizer.from_file(str(self.path))
        except Exception as e:  # tokenizers raises a bare Exception for unreadable files
            raise ValueError(f"{self.path}: not a Hugging Face tokenizer.json ({e}); pass the tokenizer.json "
                             "file of the checkpoint (not tokenizer_config.json or a folder)") from e
        self.tok.no_truncation()
        self.tok.no_padding()

    def record(self) -> Dict:
        rec = {"kind": HF_TOKENIZER_JSON, "file": str(self.path.resolve()), "sha256": _sha256(self.path),
               "vocab_size": self.tok.get_vocab_size(with_added_tokens=True)}
        if self.text_form != RAW:
            rec["text_form"] = self.text_form
        return rec

    def text(self, text: str) -> str:
        """The text as it is tokenized (its text form applied)."""
        return text if self.text_form == RAW else formalize(text, self.text_form)

    def full_length(self, text: str) -> int:
        return len(self.tok.encode(self.text(text)).ids)

    def encode(self, text: str, max_len: int) -> Tuple[List[int], int]:
        if max_len < 1:
            raise ValueError(f"tokenizer max_len={max_len}: must be >= 1")
        ids = self.tok.encode(self.text(text)).ids[:max_len]
        return ids + [0] * (max_len - len(ids)), len(ids)


def load(path=None, text_form: str = RAW):
    """-> (encode(text, max_len), record): the word hash when path is None, else HFTokenizer(path,
    text_form)."""
    if path is None:
        if text_form != RAW:
            raise ValueError("the word hash has no text form of its own (it lowercases and drops punctuation "
                             "already); --formalize-language needs --tokenizer")
        return encode, word_hash_record()
    t = HFTokenizer(path, text_form)
    return t.encode, t.record()
