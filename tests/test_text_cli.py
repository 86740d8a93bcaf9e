"""Reading user files and streaming text; the CLI's argument handling."""

import pytest

from longmem.cli.main import build_parser, main
from longmem.text.io import InputError, read_text, stream_text


def test_read_text_refuses_empty_binary_and_missing(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "blank.txt").write_text("  \n\t")
    (tmp_path / "bin.dat").write_bytes(b"\x89PNG\r\n\x00\x00\x00")
    for name, msg in [("empty.txt", "empty"), ("blank.txt", "only whitespace"), ("bin.dat", "binary"),
                      ("nope.txt", "no such file")]:
        with pytest.raises(InputError, match=msg):
            read_text(tmp_path / name)


def test_read_text_decodes_bad_utf8_with_warning(tmp_path, caplog):
    p = tmp_path / "latin1.txt"
    p.write_bytes("Café au lait".encode("latin-1"))
    assert read_text(p) == "Caf\ufffd au lait"
    assert "not valid UTF-8" in caplog.text


def test_read_text_strips_bom(tmp_path):
    p = tmp_path / "bom.txt"
    p.write_bytes("\ufeffhello".encode("utf-8"))
    assert read_text(p) == "hello"


class _ByteTokenizer:
    """Decodes ids as UTF-8 bytes, like a byte-level BPE would for split characters."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def test_stream_text_never_splits_a_character():
    ids = list("naïve ☃".encode("utf-8"))
    pieces = list(stream_text(_ByteTokenizer(), ids))
    assert "".join(pieces) == "naïve ☃"
    assert all("\ufffd" not in p for p in pieces)


def test_cli_parses_commands():
    args = build_parser().parse_args(["chat", "--file", "b.txt", "--temperature", "0"])
    assert (args.command, args.file, args.temperature, args.backbone) == ("chat", "b.txt", 0.0, "default")


def test_cli_generate_without_input_fails_cleanly(capsys):
    assert main(["generate"]) == 2
    assert "give --file and/or --prompt" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_cli_reports_bad_file_before_loading_the_model(tmp_path, capsys, command):
    (tmp_path / "e.txt").write_bytes(b"")
    assert main([command, "--file", str(tmp_path / "e.txt"), "--backbone", str(tmp_path / "no-model")]) == 2
    assert "the file is empty" in capsys.readouterr().err


def test_cli_reports_unknown_backbone(tmp_path, capsys):
    (tmp_path / "b.txt").write_text("some text")
    assert main(["generate", "--file", str(tmp_path / "b.txt"), "--backbone", str(tmp_path / "nope")]) == 2
    assert "nor a Hugging Face model directory" in capsys.readouterr().err
