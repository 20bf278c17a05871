from ragspine_pipeline.retrieval.rerank.listwise_rerank import (
    build_listwise_prompt,
    parse_listwise_response,
)


def test_parse_variants():
    assert parse_listwise_response("[2] > [1] > [3]", 3) == [1, 0, 2]
    assert parse_listwise_response("Ranking: 3, 1", 3) == [2, 0, 1]  # missing appended
    assert parse_listwise_response("[2] > [2] > [9] > [1]", 3) == [1, 0, 2]  # repeats/out of range dropped
    assert parse_listwise_response("no numbers", 3) == [0, 1, 2]
    assert parse_listwise_response(None, 2) == [0, 1]
    assert parse_listwise_response("[1]", 0) == []


def test_prompt_numbers_passages_and_truncates():
    p = build_listwise_prompt("why?", ["a  b\nc", "x" * 1000], max_passage_chars=50)
    assert "[1] a b c" in p and "[2] " + "x" * 50 + " …" in p and "why?" in p
