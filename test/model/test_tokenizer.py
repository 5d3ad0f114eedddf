# Proves the task-text tokenizer is the documented algorithm, byte for byte: the
# FNV-1a hash matches its published test vectors, and golden (text -> ids) pairs
# pin lowercasing, word splitting, non-ASCII handling, BOS/EOS, truncation and
# padding. A C++ reimplementation must pass the same pairs.
import pytest

from model import tokenizer as tok

GOLDEN = [  # (text, max_len) -> (ids, length)
    (("Pick up the red cube and place it in the bowl.", 8), ([1, 6688, 5264, 5828, 116, 1292, 2078, 2], 8)),
    (("PICK-UP  the   Apple!", 8), ([1, 6688, 5264, 5828, 651, 2, 0, 0], 6)),
    (("Café au lait, 42 times", 8), ([1, 6229, 7455, 2723, 1047, 7497, 2, 0], 7)),
    (("", 8), ([1, 2, 0, 0, 0, 0, 0, 0], 2)),
    (("a b c d e f g h i j", 8), ([1, 3652, 4873, 4466, 2431, 2024, 3245, 2], 8)),
    (("a", 2), ([1, 2], 2)),
]


def test_fnv1a32_matches_the_published_test_vectors():
    assert tok.fnv1a32(b"") == 0x811C9DC5
    assert tok.fnv1a32(b"a") == 0xE40C292C
    assert tok.fnv1a32(b"foobar") == 0xBF9CF968


@pytest.mark.parametrize("args,expected", GOLDEN)
def test_encode_reproduces_the_golden_ids(args, expected):
    assert tok.encode(*args) == expected


def test_words_lowercase_ascii_only_and_keep_utf8_bytes_inside_words():
    assert tok.words("Hello, WORLD_42!café") == [b"hello", b"world", b"42", "café".encode()]
    assert tok.words("ÉCOLE") == [b"\xc3\x89cole"]  # "É" stays upper case: no Unicode case folding


def test_same_word_gets_the_same_id_regardless_of_case_and_punctuation():
    ids, _ = tok.encode("Cube cube CUBE, (cube)", 8)
    assert len(set(ids[1:5])) == 1


def test_ids_stay_inside_the_tokenizer_vocabulary_and_never_use_unk():
    ids, n = tok.encode(" ".join(f"w{i}" for i in range(500)), 512)
    assert n == 502 and ids[0] == tok.BOS and ids[n - 1] == tok.EOS
    assert all(4 <= i < tok.TOKENIZER_VOCAB for i in ids[1:n - 1])


def test_max_len_below_two_is_rejected():
    with pytest.raises(ValueError, match="max_len"):
        tok.encode("x", 1)
