"""One way to answer (``tasks.answer``): the same answer through the app's workspace, ``longmem chat`` and the
evaluation's app entrant; the reply that the book does not say; the evidence check, the supporting sentence, the
template detector, and the decoding knobs an answer uses (the backbone's share of the logits, no repeated n-grams).
Real banks (SQLite, FTS5, faiss) and tiny llamas built in code."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import story
from tiny import chat_model, small_config, tiny_llama

from longmem.eval.answering import Asked, Entrants, Haystack, ReadingSize, says_not_said, scored
from longmem.eval.datasets.recall import template_wording
from longmem.ingest.pipeline import ingest
from longmem.model.baselines import BackboneLM
from longmem.model.lm import Sampling, repeats
from longmem.model.longmem import LongMemModel
from longmem.service import Settings, Workspace
from longmem.storage import BankDirectory
from longmem.tasks.answer import ANSWER_SAMPLING, NOT_SAID, answer
from longmem.tasks.chat import Chat
from longmem.tasks.evidence import Checker, added_words, content_words, grounding, held, nearest, stretches, support
from longmem.tasks.reading import PassageFinder, Reading

QUESTION = "What drifted over the harbour? A zeppelin?"


# -- evidence -------------------------------------------------------------------------------------------------------
def test_an_answer_s_added_words_are_its_content_words_the_question_lacks():
    assert content_words("Captain Forrester\u2019s wife is Marian.") == ["captain", "forrester", "wife", "marian"]
    assert added_words("Mrs. Forrester married Henry Collins.", "Whom did Mrs. Forrester marry?") == [
        "marri", "henry", "collin"]  # light stems
    assert added_words("The answer is: 1. a cook on the _Araminta_.", "What was Hash's job?") == ["cook", "araminta"]
    assert added_words("Forrester's wife is Forrester's wife.", "Who is Forrester's wife?") == []  # restated
    assert added_words("The hotel in the scene described in the passage is in Brighton.",
                       "Which seaside town is the hotel in?") == ["brighton"]  # words about the text add nothing


def test_grounding_is_the_share_of_added_words_the_passages_hold():
    passages = ["He had made his home there--Baker at the portals of Oregon."]
    q = "What is the name of Harkness's hometown in Oregon?"
    assert grounding("His hometown is Baker, Oregon.", q, passages) == 1.0
    assert grounding("His hometown is Portland.", q, passages) == 0.0  # invented
    assert grounding("Baker or Portland.", q, passages) == 0.5
    assert grounding("The name of Harkness's hometown in Oregon.", q, passages) == 0.0  # adds nothing
    assert grounding("Baker", q, []) == 0.0


def test_the_supporting_sentence_holds_most_of_the_answer_s_added_words():
    text = "It rained all day. He had made his home there--Baker at the portals of Oregon. Baker left."
    q = "What is Harkness's hometown in Oregon?"
    s = support("Baker, Oregon, his home", q, text)
    assert text[s.start:s.end] == "He had made his home there--Baker at the portals of Oregon." and s.words == 2
    assert support("Portland", q, text) is None


def test_the_answer_rests_on_the_citation_whose_sentence_holds_most_of_its_words():
    from longmem.tasks.answer import supported
    from longmem.tasks.reading import Citation

    def cite(n: int, text: str) -> Citation:
        return Citation(number=n, document="d", place="p", text=text, context=text, passage_id=n, finders={})

    q = "What is Harkness's hometown in Oregon?"
    cited = [cite(1, "He went to Oregon."), cite(2, "He had made his home there--Baker at the portals of Oregon."),
             cite(3, "Rain fell.")]
    out = supported(cited, "His home was Baker, Oregon.", q)
    assert [c.rests for c in out] == [False, True, False]
    assert out[1].support == (0, len(cited[1].text)) and out[2].support is None
    assert not any(c.rests for c in supported(cited, "Portland.", q))  # no sentence supports it: none is marked


def test_a_stretch_may_be_asked_to_hold_more_of_the_question_s_words():
    """With long spans read, a name of the question is in many sentences: asking a stretch for two of its words keeps
    the one where the question's matter is, and an answer made of words from elsewhere is not shown."""
    q = "What is the name of Julia's aunt in Gloucester?"
    text = ("Julia laughed at Lippett. It rained. The sea was grey. Nobody came. "
            "Her aunt in Gloucester was called Martha.")
    assert held(["lippett"], stretches(q, [text], 0)) == 1.0  # one word of the question: Julia's sentence counts
    assert held(["lippett"], stretches(q, [text], 0, 2)) == 0.0  # two: only the aunt's sentence
    assert held(["martha"], stretches(q, [text], 0, 2)) == 1.0
    assert stretches("Who?", [text], 0, 2) == stretches("Who?", [text], 0)  # no word of the question: all of them
    checker = Checker(q, [text], 0.5, 0, 2)
    assert checker.feed("It is Lippett. More") == "" and checker.stopped


def test_the_checker_shows_supported_sentences_and_ends_at_the_first_unsupported_one():
    passages = ["He made his home there--Baker at the portals of Oregon. He never saw Portland."]
    checker = Checker("What is Harkness's hometown in Oregon?", passages, 0.5)
    shown = [checker.feed(p) for p in ["Sure. His home", "town is Baker", ", Oregon. ", "He was a ", "famous surgeon",
                                       " in Seattle. He "]]
    assert shown == ["", "", "", "Sure. His hometown is Baker, Oregon.", "", ""]  # "Sure." waited, added nothing
    assert checker.stopped and checker.shown == "Sure. His hometown is Baker, Oregon."
    never = Checker("What is Harkness's hometown in Oregon?", passages, 0.5)
    assert never.feed("It is Denver. It is Baker.") == "" and never.stopped and never.shown == ""
    said = Checker("What is Harkness's hometown in Oregon?", passages, 0.5)
    assert said.feed("The answer to this question is: Baker. It") == "Baker." and said.shown == "Baker."
    title = Checker("Who married Forrester?", ["Then Mrs. Forrester married Henry Collins."], 0.5)
    assert title.feed("Mrs. Forrester married Henry Collins. Later") == "Mrs. Forrester married Henry Collins."
    turn = Checker("What is Harkness's hometown in Oregon?", passages, 0.5)
    assert turn.feed("Baker, Oregon. Question: What is Portland? It") == "Baker, Oregon." and turn.stopped
    whole = Checker("What is Harkness's hometown in Oregon?", passages, 0.5)
    assert whole.feed("Baker") == "" and whole.finish() == "Baker" and not whole.stopped  # the last sentence too


def test_the_nearest_sentence_holds_most_of_the_question_s_words():
    text = "The harbour was quiet. A silver zeppelin drifted over the harbour at noon. The zeppelin left."
    a, b = nearest("What drifted over the harbour?", text)
    assert text[a:b] == "A silver zeppelin drifted over the harbour at noon."  # 2 of the question's words, the first 1
    assert nearest("Who wrote it?", text) is None  # no content word of the question in it
    a, b = nearest("Where was the zeppelin?", text)
    assert text[a:b].startswith("A silver")  # the first of equals


def test_a_stretch_is_a_sentence_with_its_neighbours_near_the_question_s_words():
    text = "He made his home there--Baker at the portals of Oregon. It rained. The rain went on. A cat slept."
    found = stretches("What is Harkness's hometown in Oregon?", [text, "Oregon is wet. Salem is its capital."])
    first = {"made", "home", "baker", "portal", "oregon", "rain"}  # the first passage's sentences 1-2, then 1-3
    second = {"oregon", "wet", "salem", "capital"}  # the second passage's two sentences, each with its neighbour
    assert found == [first, first | {"went"}, second, second]
    assert stretches("Who slept?", [text], reach=0) == [{"cat", "slept"}]
    everywhere = stretches("What happened to Ivy Peters?", [text], reach=0)  # no sentence holds a word of the question
    assert len(everywhere) == 4 and {"cat", "slept"} in everywhere
    assert held(["baker", "salem"], found) == 0.5 and held(["baker", "oregon"], found) == 1.0
    assert held([], found) == 0.0 and held(["baker"], []) == 0.0


def test_an_answer_s_words_must_be_found_together_near_the_question_s_words():
    q = "What is Harkness's hometown in Oregon?"
    far = ["He made his home there--Baker at the portals of Oregon. It rained. The rain went on. "
           "The rain stopped. A cat slept in Portland."]
    assert grounding("His hometown is Portland.", q, far) == 1.0  # the passage holds the word, far from Oregon
    assert Checker(q, far, 0.5).feed("His hometown is Portland. It") == ""
    assert Checker(q, far, 0.5).feed("His hometown is Baker. It") == "His hometown is Baker."
    apart = ["Baker lies at the portals of Oregon.", "Oregon has a town called Salem, and a river."]
    both = Checker(q, apart, 0.5)
    assert both.feed("Baker or Salem. It") == "Baker or Salem."  # half of its words in one stretch
    split = Checker(q, apart, 0.75)
    assert split.feed("Baker or Salem. It") == "" and split.stopped  # each word is read, in another passage
    assert Checker(q, far, 0.5, reach=4).feed("His hometown is Portland. It") == "His hometown is Portland."


def test_the_template_detector_finds_the_recall_items_wording():
    assert template_wording("Question: What was the man called?") == "Question:"
    assert template_wording("He left. Answer: yes") == "Answer:"
    assert template_wording("The combination of the captain's sea chest was 4817.") is not None
    assert template_wording("What is the name of the new doctor in the village") is not None
    assert template_wording("Mrs. Forrester married Henry Collins.") is None
    assert template_wording("The question: is it?") is None


def test_a_reply_that_the_book_does_not_say_is_scored_as_such():
    assert says_not_said(NOT_SAID) and says_not_said("The text does not mention his first name.")
    assert says_not_said("His name is not given in the excerpts.") and not says_not_said("His name is Arthur.")
    assert scored("The book does not say.", ())["contains"] == 1.0
    assert scored({"answer": NOT_SAID, "said": False, "draft": "It was Denver."}, ("Denver",)) | {} == {
        "answer": NOT_SAID, "contains": 0.0, "em": 0.0, "f1": 0.0, "said": False, "draft": "It was Denver.",
        "draft_contains": 1.0}
    quoted = scored({"answer": NOT_SAID, "said": False, "draft": "No.", "quoted": ["It was far.", "In Denver"]},
                    ("Denver",))
    assert quoted["quoted_contains"] == 1.0 and "quoted" not in quoted  # scored, not stored
    assert "quoted_contains" not in scored({"answer": NOT_SAID, "said": False, "draft": "", "quoted": ["x"]}, ())


# -- decoding -------------------------------------------------------------------------------------------------------
def test_no_repeat_bans_the_token_that_would_repeat_an_n_gram():
    assert repeats([1, 2, 3, 1, 2], 3) == [3] and repeats([1, 2, 3, 1, 2], 2) == [3]
    assert repeats([1, 2], 3) == [] and repeats([5, 6], 0) == []
    with pytest.raises(ValueError, match="no_repeat"):
        Sampling(no_repeat=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.heavy
def test_no_repeat_ends_a_greedy_loop(dtype):
    model = chat_model(dtype=dtype)
    ids = model.backbone.tokenizer("the the the the", return_tensors="pt").input_ids
    for n in (2, 3):
        out = list(model.generate(ids, None, Sampling(max_new_tokens=40, temperature=0, no_repeat=n)))
        grams = [tuple(out[i:i + n]) for i in range(len(out) - n + 1)]
        assert len(grams) == len(set(grams)), n


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_side_weight_of_zero_decodes_as_the_frozen_backbone(dtype, monkeypatch):
    """w = 0: the next-token logits are the backbone's own, whatever the SideNet says; w = 1: LongMem's own; between,
    the mix."""
    import longmem.model.lm as lm

    backbone = tiny_llama(dtype=dtype)
    model = LongMemModel(backbone, small_config(segment_len=64))
    with torch.no_grad():  # open the ReZero branches: the SideNet now changes the output
        for layer in model.sidenet.layers:
            layer.alpha_attn.fill_(0.7)
            layer.alpha_mlp.fill_(0.7)
    seen: list[torch.Tensor] = []
    sample = lm._sample
    monkeypatch.setattr(lm, "_sample", lambda logits, *a: seen.append(logits.float().clone()) or sample(logits, *a))
    ids = torch.randint(1, 90, (1, 20), generator=torch.Generator().manual_seed(0))

    def first_logits(lm_, w: float = 1.0) -> torch.Tensor:
        seen.clear()
        list(lm_.generate(ids, None, Sampling(max_new_tokens=1, temperature=0, side_weight=w)))
        return seen[0]

    own, side = first_logits(BackboneLM(backbone, 64)), first_logits(model)
    assert torch.equal(first_logits(model, 0.0), own) and not torch.allclose(side, own)
    assert torch.allclose(first_logits(model, 0.25), 0.25 * side + 0.75 * own, atol=1e-5)
    with pytest.raises(ValueError, match="side_weight"):
        Sampling(side_weight=1.5)


# -- answering ------------------------------------------------------------------------------------------------------
def test_an_answer_the_passages_do_not_support_says_the_book_does_not_say(loaded):
    model, bank, memory = loaded
    finder = PassageFinder(bank, model, memory)
    chat = Chat(model, memory, Sampling(max_new_tokens=8, temperature=0))
    unchecked = answer(chat, finder, QUESTION, Reading(abstain=0.0))
    draft = "".join(unchecked)
    assert unchecked.said and unchecked.citations and "zeppelin" in unchecked.citations[-1].text
    assert chat.history[-1]["content"] == draft
    checked = answer(chat, finder, QUESTION, Reading(abstain=1.0))  # nothing a random model says is all grounded
    assert "".join(checked) == NOT_SAID and not checked.said and checked.draft == draft
    assert checked.citations and all(c.support is None for c in checked.citations)  # the closest passages, shown
    c = checked.citations[-1]  # each quoted by its sentence nearest the question
    assert c.nearest is not None and "zeppelin" in c.text[c.nearest[0]:c.nearest[1]].lower()
    assert chat.history[-2:] == [{"role": "user", "content": QUESTION},  # the turn is what the reader saw
                                 {"role": "assistant", "content": NOT_SAID, "said": False}]


def test_a_supported_answer_marks_its_sentence_in_the_passage(loaded, monkeypatch):
    model, bank, memory = loaded
    finder = PassageFinder(bank, model, memory)
    chat = Chat(model, memory, Sampling(max_new_tokens=8, temperature=0))
    def said(self, q, reading=None, search=True, trace=None):
        yield "A silver zeppelin."
        self.history += [{"role": "user", "content": q}, {"role": "assistant", "content": "A silver zeppelin."}]

    monkeypatch.setattr(Chat, "ask", said)
    reply = answer(chat, finder, "What drifted over the harbour?")
    assert "".join(reply) == "A silver zeppelin." and reply.said and reply.grounding == 1.0
    c = reply.citations[-1]
    assert c.support is not None and "zeppelin" in c.text[c.support[0]:c.support[1]]


def test_a_whole_draft_is_written_past_the_check_unshown(loaded, monkeypatch):
    """For records (``whole_draft``): the check ends the reply at the first sentence the passages do not hold, yet the
    draft is the model's whole answer; the reply and the turn recorded are the same as without it."""
    model, bank, memory = loaded
    finder = PassageFinder(bank, model, memory)
    pieces = ["A silver zeppelin. ", "It was owned by Duke Ferdinand of Patagonia. ", "He sold it in Lisbon ",
              "for a horse."]
    asked = []

    def said(self, q, reading=None, search=True, trace=None):
        for p in pieces:
            asked.append(p)
            yield p
        self.history += [{"role": "user", "content": q}, {"role": "assistant", "content": "".join(pieces)}]

    monkeypatch.setattr(Chat, "ask", said)
    replies, turns, drafts = [], [], []
    for whole in (False, True):
        asked.clear()
        chat = Chat(model, memory, Sampling(max_new_tokens=8, temperature=0))
        reply = answer(chat, finder, "What drifted over the harbour?", whole_draft=whole)
        replies.append(("".join(reply), reply.said))
        turns.append(chat.history[-2:])
        drafts.append(reply.draft)
    assert replies[0] == replies[1] == ("A silver zeppelin.", True) and turns[0] == turns[1]
    assert turns[0][-1]["content"] == "A silver zeppelin."
    assert "horse" not in drafts[0] and "Patagonia" in drafts[0]  # generation stopped after the sentence refused
    assert drafts[1] == "".join(pieces) == "".join(asked)  # the whole draft, past the check


def test_a_reader_says_the_book_does_not_say_only_when_sure_of_it(loaded):
    """``Reading.decline`` with the book-or-not prompt: the reader's probability of "The book does not say." is read
    once the prompt is; below the threshold it answers otherwise, above it the reply is that the book does not say,
    and the check still judges what it answers."""
    model, bank, memory = loaded
    finder = PassageFinder(bank, model, memory)

    def asked(decline: float):
        chat = Chat(model, memory, Sampling(max_new_tokens=8, temperature=0))
        reply = answer(chat, finder, QUESTION, Reading(prompt="book-or-not", decline=decline, abstain=0.0))
        return "".join(reply), reply

    text, unsure = asked(1.0)
    assert unsure.said and 0.0 < unsure.trace.decline < 1.0 and not unsure.trace.declined
    assert len(unsure.trace.probs) == len(model.backbone.tokenizer(text, add_special_tokens=False).input_ids)
    text, sure = asked(unsure.trace.decline / 2)
    assert sure.trace.declined and text == NOT_SAID and not sure.said
    assert sure.trace.decline == pytest.approx(unsure.trace.decline, rel=1e-3)
    plain = answer(Chat(model, memory, Sampling(max_new_tokens=8, temperature=0)), finder, QUESTION,
                   Reading(prompt="book", decline=0.5))
    "".join(plain)
    assert plain.trace.decline is None  # the book prompt names no decline: nothing weighed


def test_an_answer_is_shown_only_when_the_reader_was_sure_how_it_begins(loaded):
    """``Reading.sure``: the least probability of the answer's first ``SURE_TOKENS`` tokens; below the threshold the
    reply says that the book does not say (the whole draft still written for records), above it the answer is as
    without the threshold."""
    from longmem.tasks.reading import SURE_TOKENS

    model, bank, memory = loaded
    finder = PassageFinder(bank, model, memory)

    def asked(sure: float, whole: bool = False):
        chat = Chat(model, memory, Sampling(max_new_tokens=8, temperature=0))
        reply = answer(chat, finder, QUESTION, Reading(abstain=0.0, sure=sure), whole_draft=whole)
        return "".join(reply), reply, chat

    plain, free, _ = asked(0.0)
    assert free.sure is None and len(free.trace.probs) == 8
    least = min(free.trace.probs[:SURE_TOKENS])
    text, kept, _ = asked(least / 2)
    assert text == plain and kept.said and kept.sure == pytest.approx(least)
    text, doubted, chat = asked(min(1.0, least * 1.01), whole=True)
    assert text == NOT_SAID and not doubted.said and doubted.draft == plain
    assert chat.history[-1] == {"role": "assistant", "content": NOT_SAID, "said": False}
    text, cut, _ = asked(min(1.0, least * 1.01))
    assert text == NOT_SAID and len(cut.trace.probs) == SURE_TOKENS  # no need to write on once unsure
    with pytest.raises(ValueError, match="sure"):
        Reading(sure=-0.1)


def test_a_question_with_no_word_of_the_book_reads_what_memory_retrieves(loaded):
    model, bank, memory = loaded
    chat = Chat(model, memory, Sampling(max_new_tokens=8, temperature=0))
    question = "What is the capital of Australia?"
    assert bank.search_passages(question, 4) == []  # no word of it in the book
    reply = answer(chat, PassageFinder(bank, model, memory), question, Reading(abstain=1.0))
    assert reply.found and all(set(f.ranks) == {"memory"} for f in reply.found) and reply.citations
    assert "".join(reply) == NOT_SAID and not reply.said  # a random model's answer is not in them


def test_nothing_to_read_is_said_without_asking_the_model(loaded, monkeypatch):
    model, bank, memory = loaded
    chat = Chat(model, memory, Sampling(max_new_tokens=8, temperature=0))
    finder = PassageFinder(bank, model, memory)
    monkeypatch.setattr(finder, "rank", lambda *a, **k: [])
    monkeypatch.setattr(model, "generate", lambda *a, **k: pytest.fail("the model was asked"))
    reply = answer(chat, finder, "What is the capital of Australia?")
    assert "".join(reply) == NOT_SAID and not reply.said and reply.citations == []
    assert chat.history == [{"role": "user", "content": "What is the capital of Australia?"},
                            {"role": "assistant", "content": NOT_SAID, "said": False}]


def test_a_reply_that_the_book_does_not_say_stays_out_of_later_prompts(loaded):
    """A 135M reader copies an earlier 'the book does not say' into the next answers: the conversation keeps such a
    turn for the reader, and prompts leave it out (its question too)."""
    model, _, memory = loaded
    chat = Chat(model, memory, Sampling(max_new_tokens=8, temperature=0))
    chat.record("Who kept the lighthouse?", NOT_SAID, said=False)
    chat.record("What drifted over the harbour?", "A zeppelin.")
    tok = model.backbone.tokenizer
    prompt = tok.decode(chat.prompt_ids("And then?")[0])
    assert "A zeppelin." in prompt and "harbour" in prompt
    assert "lighthouse" not in prompt and "does not say" not in prompt
    assert len(chat.history) == 4 and chat.history[1]["content"] == NOT_SAID


def test_a_reloaded_conversation_keeps_its_replies_that_the_book_does_not_say_out_of_prompts(tmp_path):
    ws = Workspace(chat_model(segment_len=512), BankDirectory(tmp_path / "banks"))
    try:
        ws.create_bank("empty")
        list(ws.chat("empty", "Who is the keeper of the lighthouse?"))
    finally:
        ws.close()
    ws = Workspace(chat_model(segment_len=512), BankDirectory(tmp_path / "banks"))
    try:
        assert [t["said"] for t in ws.chat_history("empty")] == [True, False]
        list(ws.chat("empty", "Who rang the bell?"))
        chat = ws.sessions.session("empty").chat
        assert [t.get("said", True) for t in chat.history] == [True, False, True, False]
        assert "lighthouse" not in ws.model.backbone.tokenizer.decode(chat.prompt_ids("Why?")[0])
    finally:
        ws.close()


@pytest.mark.heavy
def test_questions_that_cannot_be_asked_are_refused_clearly(loaded):
    model, bank, memory = loaded
    chat = Chat(model, memory, Sampling(max_new_tokens=8, temperature=0))
    finder = PassageFinder(bank, model, memory)
    with pytest.raises(ValueError, match="the question is empty"):
        answer(chat, finder, "   ")
    with pytest.raises(ValueError, match="the question is too long: .* ask in fewer words"):
        answer(chat, finder, "why " * 2000)
    reply = answer(chat, finder, "Qu'est-ce qui flottait au-dessus du port?")  # another language: an answer
    assert "".join(reply) and chat.history[-1]["role"] == "assistant"


def test_a_bank_with_no_text_gets_a_clear_reply(tmp_path):
    ws = Workspace(chat_model(segment_len=512), BankDirectory(tmp_path / "banks"))
    try:
        ws.create_bank("empty")
        reply = ws.chat("empty", "Who is the keeper of the lighthouse?")
        assert "".join(reply) == NOT_SAID and not reply.said and reply.citations == []
    finally:
        ws.close()


def test_an_answer_left_unfinished_is_not_recorded(loaded):
    model, bank, memory = loaded
    chat = Chat(model, memory, Sampling(max_new_tokens=20, temperature=0))
    reply = answer(chat, PassageFinder(bank, model, memory), QUESTION, Reading(abstain=0.0))
    next(iter(reply))
    reply.close()
    assert chat.history == [] and not reply.complete


def test_a_stopped_answer_ends_at_once_and_is_not_recorded_even_while_its_sentences_are_held(loaded):
    model, bank, memory = loaded
    chat = Chat(model, memory, Sampling(max_new_tokens=20, temperature=0))
    asked = []
    reply = answer(chat, PassageFinder(bank, model, memory), QUESTION, Reading(abstain=1.0),
                   stop=lambda: asked.append(1) or len(asked) > 3)  # the reader stops at the 4th token
    assert list(reply) == [] and len(asked) == 4  # nothing shown yet (held for checking), and no NOT_SAID either
    assert chat.history == [] and not reply.complete and reply.citations


# -- the same answer everywhere -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved(chat_checkpoint, tmp_path_factory):
    """``chat_checkpoint`` and a bank of the story built with it."""
    root = tmp_path_factory.mktemp("same")
    (root / "story.txt").write_text(story())
    model = LongMemModel.load(chat_checkpoint)
    with BankDirectory(root / "banks").create("lib", model) as bank:
        ingest(bank, model, root / "story.txt")
    return chat_checkpoint, root / "banks"


@pytest.mark.parametrize("checks", [True, False])
@pytest.mark.heavy
def test_the_workspace_the_cli_and_the_eval_give_the_same_answer(saved, capsys, checks):
    """Item 1 of the answers issue: one function, one set of defaults, whoever asks."""
    from longmem.cli.main import main

    ckpt, banks = saved
    question = "What drifted over the harbour?"
    assert main(["chat", "--bank", "lib", "--ask", question, "--checkpoint", ckpt, "--banks-dir", str(banks),
                 "--abstain", "yes" if checks else "no"]) == 0
    printed = capsys.readouterr().out.splitlines()
    cli = printed[printed.index(f"> {question}") + 1]

    model = LongMemModel.load(ckpt)
    ws = Workspace(model, BankDirectory(banks))
    try:
        reply = ws.chat("lib", question, Settings(abstain=checks))
        app = "".join(reply)
    finally:
        ws.close()

    with BankDirectory(banks).open("lib") as bank:
        memory = bank.load_memory(model)
        entrants = Entrants(model, BackboneLM(model.backbone, model.segment_len), None,
                            ReadingSize(entrants=["app"], **({} if checks else {"abstain": 0.0})))
        hay = Haystack(bank, memory, np.zeros(0, dtype=np.int64))
        got = entrants.answers({"app"}, Asked(question, ("zeppelin",), [], lambda f: False, []), hay, {"lexical": []})
    norm = " ".join
    assert norm(cli.split()) == norm(app.split()) == got["app"]["answer"]
    assert ANSWER_SAMPLING.temperature == 0 == Settings().temperature  # greedy by default everywhere
