"""SubRip subtitles (``longmem.ingest.subtitles``, the registry's "srt" format): what is said, as running text, without
cue numbers, timings or markup; refused by name when it is not a subtitle file."""

from __future__ import annotations

import pytest

from longmem.ingest import formats, subtitles
from longmem.ingest.limits import ExtractLimits, LimitError
from longmem.ingest.readers import check_source, open_source
from longmem.ingest.titles import book_title
from longmem.text.io import InputError

FILM = ("1\n00:00:01,000 --> 00:00:03,500\n<i>In my younger and more vulnerable years</i>\n"
        "my father gave me advice.\n\n"
        "2\n00:00:03,600 --> 00:00:05,000\n{\\an8}I've been turning it over\n\n"
        "3\n00:00:05,100 --> 00:00:07,000\n<font color=\"#ffff00\">ever since.</font>\n\n"
        "4\n00:00:12,000 --> 00:00:14,000\n- How many?\n- 1922\n\n"  # a pause before; a number as text
        "5\n00:00:14,100 --> 00:00:15,000 X1:100 X2:200 Y1:10 Y2:20\n42\n")


def extracted(tmp_path, text: str | bytes, name: str = "film.srt") -> tuple[str, dict]:
    """(text, facts) of a subtitle file read by the registry's reader, in this process."""
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    out = tmp_path / "out.txt"
    facts = formats.extract(p, "srt", out, ExtractLimits())
    return out.read_text(encoding="utf-8"), facts


def test_cues_become_running_text_in_paragraphs_at_pauses(tmp_path):
    text, facts = extracted(tmp_path, FILM)
    assert text == ("In my younger and more vulnerable years my father gave me advice. I've been turning it over "
                    "ever since.\n\n- How many? - 1922 42")
    assert (facts["title"], facts["meta"]) == ("", {"cues": 5})


def test_crlf_a_bom_dotted_milliseconds_and_missing_blank_lines(tmp_path):
    raw = ("\ufeff1\r\n00:00:01.000 --> 00:00:02.000\r\nFirst line.\r\n2\r\n00:00:02.100 --> 00:00:03.000\r\n"
           "Second line.\r\n\r\n\r\n3\r\n00:00:03.100 --> 00:00:04.000\r\nThird.").encode()
    assert extracted(tmp_path, raw)[0] == "First line. Second line. Third."


def test_a_long_stretch_of_speech_is_cut_at_a_sentence_end(tmp_path):
    cues = "".join(f"{i + 1}\n00:{i // 60:02d}:{i % 60:02d},000 --> 00:{i // 60:02d}:{i % 60:02d},900\n"
                   f"{'Sentence number %d goes on and on' % i}{'.' if i % 10 == 9 else ''}\n\n" for i in range(200))
    text, _ = extracted(tmp_path, cues)
    paragraphs = text.split("\n\n")
    assert len(paragraphs) > 2 and all(p.endswith(".") for p in paragraphs[:-1])
    assert all(len(p) < subtitles.PARAGRAPH_CHARS + 500 for p in paragraphs)
    assert " ".join(paragraphs).count("Sentence number") == 200


def test_a_subtitle_file_through_the_readers(tmp_path):
    """The upload check and the job read it as the registry says: extracted in the child, titled by its name."""
    p = tmp_path / "The Great Gatsby.srt"
    p.write_text(FILM)
    assert check_source(p) == "srt"
    with open_source(p) as src:
        text = "".join(b.text for b in src.blocks())
        assert (src.kind, src.title, src.own_title, src.meta) == ("text", "The Great Gatsby", None, {"cues": 5})
    assert text.startswith("In my younger") and "00:00" not in text and "<i>" not in text
    assert book_title(p) is None


@pytest.mark.parametrize("content, message", [
    ("1\n00:00:01,000 --> 00:00:02,000\n<i></i>\n\n2\n00:00:03,000 --> 00:00:04,000\n\n", r"film\.srt: has no text"),
    ("WEBVTT\n\n00:01.000 --> 00:02.000\nHi\n", r"film\.srt: has no text"),  # WebVTT's short timings are not SRT's
])
def test_a_subtitle_file_without_text_is_refused(tmp_path, content, message):
    with pytest.raises(InputError, match=message):
        extracted(tmp_path, content)


@pytest.mark.parametrize("data, message", [
    (b"Just a transcript.\n", r"film\.srt: cannot read this SRT: there is no cue timing"),
    ("1\n00:00:01,000 --> 00:00:02,000\nHi\n".encode("utf-16"), r"film\.srt: cannot read this SRT: .*UTF-16"),
])
def test_a_file_that_is_not_srt_is_refused_by_name(tmp_path, data, message):
    p = tmp_path / "film.srt"
    p.write_bytes(data)
    with pytest.raises(InputError, match=message):
        check_source(p)


def test_the_signature(tmp_path):
    assert subtitles.signature(FILM.encode()) is None
    assert "UTF-16" in subtitles.signature(FILM.encode("utf-16"))
    assert "binary" in subtitles.signature(b"00:00:01,000 --> \x00\x01")
    assert "no cue timing" in subtitles.signature(b"Just a transcript.\n")


def test_the_text_limit_holds(tmp_path):
    p = tmp_path / "long.srt"
    p.write_text(FILM)
    with pytest.raises(LimitError, match=r"long\.srt: its text runs on, past the limit of 50 characters"):
        formats.extract(p, "srt", tmp_path / "out.txt", ExtractLimits(max_chars=50))
