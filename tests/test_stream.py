"""`rkstudy speak ... --stream`: audio out while the text is spoken, read as a player reads it (rkstudy.plan.stream)."""

import subprocess
import sys
import wave

import numpy as np
import pytest
import soundfile as sf

from rkstudy.paths import REPO, TEXTS
from rkstudy.plan import stream

TEXT = TEXTS / "speak_443.txt"


def speak_cmd(*extra):
    return [sys.executable, "-m", "rkstudy", "speak", "piper", "--plan", "{}", "--text-file", str(TEXT),
            "--text-chunk-size", "60", *map(str, extra)]


@pytest.mark.slow
def test_a_pipe_hears_the_first_chunk_before_the_text_is_done_and_the_bytes_are_the_audio_files(tmp_path):
    proc = subprocess.Popen(speak_cmd("--stream", "-", "--audio", tmp_path / "whole.wav", "--results", tmp_path / "r"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    first = proc.stdout.read(4096)   # blocks until the first chunk is written
    still_speaking = proc.poll() is None
    rest = proc.stdout.read()
    assert proc.wait(timeout=600) == 0, proc.stderr.read().decode()[-800:]
    said = proc.stderr.read().decode()
    assert len(first) == 4096 and still_speaking  # audio arrived while the rest of the text was synthesized
    whole, rate = sf.read(tmp_path / "whole.wav", dtype="int16")
    np.testing.assert_array_equal(np.frombuffer(first + rest, "<i2"), whole)  # the --audio file's samples
    assert rate == 22050 and "piper on fp32" in said and "first audio" in said  # the lines went to stderr
    (row,) = list((tmp_path / "r").glob("*/speak.csv"))
    assert row.is_file()


@pytest.mark.slow
def test_a_reader_that_goes_away_stops_the_run_with_141_and_nothing_written(tmp_path):
    proc = subprocess.Popen(speak_cmd("--stream", "-", "--audio", tmp_path / "whole.wav", "--results", tmp_path / "r"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    proc.stdout.read(1000)
    proc.stdout.close()   # the player quits
    assert proc.wait(timeout=600) == 141
    lines = proc.stderr.read().decode().strip().splitlines()
    assert lines[-1].startswith("rkstudy: error: the stream's reader closed standard output"), lines
    assert not (tmp_path / "whole.wav").exists() and not (tmp_path / "r").exists()


@pytest.mark.slow
def test_a_wav_stream_file_ends_with_its_real_lengths(tmp_path):
    out = tmp_path / "live.wav"
    subprocess.run(speak_cmd("--stream", out, "--audio", tmp_path / "whole.wav", "--results", tmp_path / "r"),
                   cwd=REPO, check=True, capture_output=True, timeout=600)
    with wave.open(str(out)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 22050)
        frames = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    np.testing.assert_array_equal(frames, sf.read(tmp_path / "whole.wav", dtype="int16")[0])


def test_the_open_wav_header_is_what_streaming_players_read():
    head = stream.wav_header(22050)
    assert len(head) == 44 and head[4:8] == b"\xff\xff\xff\xff" and head[40:44] == b"\xff\xff\xff\xff"
    closed = stream.wav_header(16000, 3200)
    assert int.from_bytes(closed[4:8], "little") == 36 + 3200 and int.from_bytes(closed[24:28], "little") == 16000


def test_a_failed_run_leaves_no_stream_file(tmp_path):
    target = tmp_path / "live.pcm"
    sink = stream.Sink(str(target), 22050)
    sink.write(np.full(100, 0.5, np.float32))
    assert target.stat().st_size == 200
    sink.abandon()
    assert not target.exists()
