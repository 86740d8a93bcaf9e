"""SQuAD in-context learning data and scoring: official v1.1 EM/F1, generation cutting, splits, file reading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from longmem.eval.datasets.squad import (
    QA,
    TEMPLATE,
    answer_from_generation,
    exact_match,
    f1,
    format_demo,
    format_prompt,
    normalize_answer,
    read_squad,
    split_squad,
)
from longmem.util.data import data_dir


def qa(i: int = 0, passage: str = "Some passage.", question: str = "What?", answers=("x",)) -> QA:
    return QA(id=f"q{i}", title="T", passage=passage, question=question, answers=tuple(answers))


def corpus(n_passages: int, per_passage: int) -> list[QA]:
    return [qa(p * per_passage + q, passage=f"passage {p}", question=f"question {p}.{q}")
            for p in range(n_passages) for q in range(per_passage)]


# ----------------------------------------------------------------------------------------------- normalisation


@pytest.mark.parametrize("raw, expected", [
    ("The Denver Broncos!", "denver broncos"),
    ("  a  cat, an apple;   the end. ", "cat apple end"),
    ("theatre anthem", "theatre anthem"),  # articles only as whole words
    ("U.S.-led", "usled"),  # punctuation is removed, not turned into spaces
    ("The", ""),
])
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


# --------------------------------------------------------------------------------------------------------- EM


def test_exact_match_ignores_case_articles_punctuation_whitespace():
    assert exact_match("the  Denver Broncos.", ["Denver Broncos"]) == 1.0
    assert exact_match("Denver", ["Denver Broncos"]) == 0.0


def test_exact_match_is_max_over_golds():
    assert exact_match("Santa Clara", ["Levi's Stadium", "Santa Clara, California", "santa clara"]) == 1.0
    assert exact_match("Santa", ["Levi's Stadium", "Santa Clara"]) == 0.0


def test_exact_match_empty_prediction():
    assert exact_match("", ["Denver Broncos"]) == 0.0
    assert exact_match("", ["The"]) == 1.0  # both normalise to "", as in the official script


# --------------------------------------------------------------------------------------------------------- F1


def test_f1_full_and_no_overlap():
    assert f1("The Denver Broncos", ["denver broncos!"]) == 1.0
    assert f1("Carolina Panthers", ["Denver Broncos"]) == 0.0


def test_f1_partial_overlap_exact_fraction():
    # prediction 3 tokens, gold 2 tokens, 1 shared: P = 1/3, R = 1/2, F1 = 2PR/(P+R) = (1/3)/(5/6) = 2/5
    assert f1("Denver Broncos team", ["Seattle Broncos"]) == pytest.approx(2 / 5)
    # "the" is dropped before counting: prediction [denver], gold [denver, broncos]: P = 1, R = 1/2, F1 = 2/3
    assert f1("the Denver", ["Denver Broncos"]) == pytest.approx(2 / 3)


def test_f1_counts_repeated_tokens_once_per_match():
    # prediction [new, new, york], gold [new, york]: overlap 2, P = 2/3, R = 1, F1 = 4/5
    assert f1("new new york", ["New York"]) == pytest.approx(4 / 5)


def test_f1_is_max_over_golds():
    golds = ["Denver Broncos", "the Broncos", "Broncos"]
    # against [broncos]: overlap 1, P = 1/2, R = 1 -> 2/3; against [denver, broncos]: P = 1/2, R = 1/2 -> 1/2
    assert f1("Broncos football", golds) == pytest.approx(2 / 3)


def test_f1_empty_prediction():
    assert f1("", ["Denver Broncos"]) == 0.0
    assert f1("   ", ["a"]) == 0.0  # official v1.1: no tokens in common scores 0 even when both are empty


def test_scores_refuse_no_golds():
    with pytest.raises(ValueError, match="no gold"):
        f1("x", [])
    with pytest.raises(ValueError, match="no gold"):
        exact_match("x", ())
    with pytest.raises(TypeError):
        f1("x", "x")


# ------------------------------------------------------------------------------------------ cutting generations


@pytest.mark.parametrize("generated, answer", [
    (" Denver Broncos\n\nPassage: Next one", "Denver Broncos"),
    (" Denver Broncos", "Denver Broncos"),
    (" Denver Broncos Passage: The 2015 season", "Denver Broncos"),
    (" Denver Broncos. Question: Who won? Answer: x", "Denver Broncos."),
    (" 1962 Question: a\nb", "1962"),
    ("\nDenver", ""),
    ("", ""),
    ("  Santa Clara, California  ", "Santa Clara, California"),
])
def test_answer_from_generation(generated, answer):
    assert answer_from_generation(generated) == answer


# ---------------------------------------------------------------------------------------------------- templates


def test_format_demo_and_prompt_follow_the_paper_template():
    item = qa(passage="Super Bowl 50 was\nplayed in 2016. ", question="When was it played? ",
              answers=("2016", "in 2016"))
    assert TEMPLATE == "Passage: {passage}\n Question: {question} Answer: {answer}"
    prompt = "Passage: Super Bowl 50 was played in 2016.\n Question: When was it played? Answer:"
    assert format_prompt(item) == prompt
    assert format_demo(item) == prompt + " 2016"
    assert format_demo(item) == format_prompt(item) + " " + item.answers[0]


def test_format_with_custom_template_and_braces_in_text():
    item = qa(passage="f(x) = {x}", question="Q?", answers=("{x}",))
    template = "{{P}} {passage} | {question} => {answer}"
    assert format_demo(item, template) == "{P} f(x) = {x} | Q? => {x}"
    assert format_prompt(item, template) == "{P} f(x) = {x} | Q? =>"
    with pytest.raises(ValueError, match="exactly once"):
        format_prompt(item, "{passage} {question}")


# -------------------------------------------------------------------------------------------------------- split


def test_split_sizes_disjoint_and_passage_disjoint():
    qas = corpus(n_passages=40, per_passage=5)
    split = split_squad(qas, n_context=3, n_memory=20, n_test=50, seed=0)
    assert (len(split.context), len(split.memory), len(split.test)) == (3, 20, 50)
    demos = split.context + split.memory
    ids = [q.id for q in demos + split.test]
    assert len(ids) == len(set(ids))
    demo_passages = {q.passage for q in demos}
    assert len(demo_passages) == len(demos)  # one demonstration per passage
    assert not demo_passages & {q.passage for q in split.test}


def test_split_is_deterministic_for_a_seed():
    qas = corpus(n_passages=30, per_passage=4)
    a = split_squad(qas, 3, 10, 20, seed=7)
    b = split_squad(qas, 3, 10, 20, seed=7)
    c = split_squad(qas, 3, 10, 20, seed=8)
    assert a == b
    assert a != c


def test_split_with_zero_counts():
    split = split_squad(corpus(3, 2), n_context=0, n_memory=0, n_test=6, seed=0)
    assert split.context == split.memory == []
    assert len(split.test) == 6


def test_split_too_few_passages_for_demonstrations():
    with pytest.raises(ValueError, match=r"3 context \+ 20 memory .* 23 distinct passages .* only 10"):
        split_squad(corpus(10, 5), n_context=3, n_memory=20, n_test=1, seed=0)


def test_split_too_few_test_questions():
    # 10 passages x 5 questions; 3 + 2 demonstration passages leave 5 passages with 25 questions
    with pytest.raises(ValueError, match=r"26 test questions wanted.* only 25 questions"):
        split_squad(corpus(10, 5), n_context=3, n_memory=2, n_test=26, seed=0)
    assert len(split_squad(corpus(10, 5), n_context=3, n_memory=2, n_test=25, seed=0).test) == 25


def test_split_refuses_negative_counts():
    with pytest.raises(ValueError, match="n_memory"):
        split_squad(corpus(5, 2), n_context=1, n_memory=-1, n_test=1, seed=0)


# ------------------------------------------------------------------------------------------------- read_squad


def squad_json(**overrides) -> dict:
    question = {"id": "q1", "question": "Who won?", "answers": [
        {"answer_start": 0, "text": "Denver Broncos"},
        {"answer_start": 0, "text": "Denver Broncos"},
        {"answer_start": 0, "text": "Broncos"},
    ]}
    question.update(overrides)
    return {"version": "1.1", "data": [
        {"title": "Super_Bowl_50", "paragraphs": [
            {"context": "Denver Broncos won.", "qas": [question, {"id": "q2", "question": "What?",
                                                                 "answers": [{"answer_start": 0, "text": "won"}]}]},
        ]},
        {"title": "Warsaw", "paragraphs": [
            {"context": "Warsaw is a city.", "qas": [{"id": "q3", "question": "What is Warsaw?",
                                                      "answers": [{"answer_start": 12, "text": "city"}]}]},
        ]},
    ]}


def write(tmp_path: Path, content) -> Path:
    path = tmp_path / "squad.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return path


def test_read_squad_fixture(tmp_path):
    qas = read_squad(write(tmp_path, squad_json()))
    assert [q.id for q in qas] == ["q1", "q2", "q3"]
    assert qas[0] == QA(id="q1", title="Super_Bowl_50", passage="Denver Broncos won.", question="Who won?",
                        answers=("Denver Broncos", "Broncos"))
    assert qas[2].title == "Warsaw" and qas[2].answers == ("city",)


def test_read_squad_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        read_squad(tmp_path / "nope.json")


def test_read_squad_not_json(tmp_path):
    path = write(tmp_path, '{"data": [')
    with pytest.raises(ValueError, match=r"squad\.json: not valid JSON"):
        read_squad(path)
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ValueError, match=r"squad\.json: not a UTF-8"):
        read_squad(path)


@pytest.mark.parametrize("content, message", [
    ([1, 2, 3], r"the top level should be a JSON object"),
    ({"version": "1.1"}, r"the top level has no 'data' field"),
    ({"data": {"title": "x"}}, r"the top level.data should be a list"),
    ({"data": [{"title": "T"}]}, r"data\[0\] has no 'paragraphs' field"),
    ({"data": [{"title": "T", "paragraphs": [{"context": 3, "qas": []}]}]},
     r"data\[0\]\.paragraphs\[0\]\.context should be a string, found int"),
    ({"data": []}, r"holds no questions"),
])
def test_read_squad_wrong_shape(tmp_path, content, message):
    with pytest.raises(ValueError, match=r"squad\.json: .*" + message):
        read_squad(write(tmp_path, content))


def test_read_squad_question_errors(tmp_path):
    with pytest.raises(ValueError, match=r"data\[0\]\.paragraphs\[0\]\.qas\[0\] has no 'question' field"):
        bad = squad_json()
        del bad["data"][0]["paragraphs"][0]["qas"][0]["question"]
        read_squad(write(tmp_path, bad))
    with pytest.raises(ValueError, match=r"qas\[0\] \(id 'q1'\) has no answers.*v2\.0"):
        read_squad(write(tmp_path, squad_json(answers=[], is_impossible=True)))
    with pytest.raises(ValueError, match=r"qas\[0\]\.answers\[0\] has no 'text' field"):
        read_squad(write(tmp_path, squad_json(answers=[{"answer_start": 0}])))
    with pytest.raises(ValueError, match=r"question id 'q2' appears more than once"):
        read_squad(write(tmp_path, squad_json(id="q2")))


@pytest.mark.shared_data
def test_read_real_dev_file():
    qas = read_squad(data_dir() / "squad" / "dev-v1.1.json")
    assert len(qas) == 10_570
    assert len({q.title for q in qas}) == 48
    assert len({q.id for q in qas}) == 10_570
    assert all(q.answers for q in qas)
    split = split_squad(qas, n_context=3, n_memory=200, n_test=1000, seed=0)
    assert not {q.passage for q in split.context + split.memory} & {q.passage for q in split.test}
