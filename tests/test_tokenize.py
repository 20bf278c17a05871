from ragspine_pipeline.retrieval.lexical.analysis.analyzer import make_analyzer, tokenize


def test_ascii_words_lowercased_and_split_on_punctuation():
    assert tokenize("Hello, World! GPT-4o e.g.") == ["hello", "world", "gpt", "4o", "e", "g"]


def test_cjk_unigrams_then_adjacent_bigrams_per_run():
    assert tokenize("营收下滑") == ["营", "收", "下", "滑", "营收", "收下", "下滑"]
    # Punctuation and ASCII break CJK runs: no bigram crosses them.
    assert tokenize("营收，下滑") == ["营", "收", "营收", "下", "滑", "下滑"]
    assert tokenize("A股上涨") == ["a", "股", "上", "涨", "股上", "上涨"]


def test_nfkc_full_width_matches_ascii():
    assert tokenize("ＡＢＣ１２３") == tokenize("abc123") == ["abc123"]


def test_hiragana_katakana_hangul_are_cjk():
    assert tokenize("カナ") == ["カ", "ナ", "カナ"]
    assert tokenize("ひら") == ["ひ", "ら", "ひら"]
    assert tokenize("한국") == ["한", "국", "한국"]
    # Half-width katakana normalizes to full-width first.
    assert tokenize("ｶﾅ") == ["カ", "ナ", "カナ"]


def test_single_cjk_char_has_no_bigram_and_empty_text():
    assert tokenize("字") == ["字"]
    assert tokenize("") == []
    assert tokenize("—…!") == []


def test_english_analyzer_stems_ascii_only_and_drops_stop_words():
    an = make_analyzer("english")
    assert an("The revenues were declining 营收") == ["revenu", "declin", "营", "收", "营收"]
    assert make_analyzer("spec")("The revenues") == ["the", "revenues"]


def test_unknown_analyzer_is_a_clear_error():
    import pytest

    with pytest.raises(ValueError, match="unknown analyzer"):
        make_analyzer("klingon")


def test_spec_tokenize_ignores_the_index_analyzer_setting(monkeypatch):
    """RAGSPINE_ANALYZER picks the index analyzer; the spec tokenizer never changes."""
    text = "Crédit Agricole à Lyon, Привет 营收"
    before = tokenize(text)
    monkeypatch.setenv("RAGSPINE_ANALYZER", "unicode:fr")
    assert tokenize(text) == before == ["cr", "dit", "agricole", "lyon", "营", "收", "营收"]
    assert make_analyzer(None).name == "unicode:french"
