"""FileTail against what verl and log rotation do to a file."""
import os

from omniwatch.sources.tail import FileTail


def line(n: int) -> bytes:
    return b'{"step":%d,"data":{"timing_s/step":%d.5}}\n' % (n, n)


def test_missing_file_is_waited_for(tmp_path):
    t = FileTail(str(tmp_path / "run.jsonl"))
    assert t.poll().events == ["missing"]
    (tmp_path / "run.jsonl").write_bytes(line(1))
    r = t.poll()
    assert r.events == ["opened"] and r.lines == [line(1).strip()] and r.backlog == 1


def test_partial_last_line_waits_for_its_newline(tmp_path):
    p = tmp_path / "run.jsonl"
    p.write_bytes(line(1) + line(2)[:10])
    t = FileTail(str(p))
    assert len(t.poll().lines) == 1
    with open(p, "ab") as f:
        f.write(line(2)[10:])
    r = t.poll()
    assert r.lines == [line(2).strip()] and r.backlog == 0


def test_truncation_by_a_restarted_trainer_is_seen_even_when_it_wrote_past_our_offset(tmp_path):
    p = tmp_path / "run.jsonl"
    p.write_bytes(line(1) + line(2))
    t = FileTail(str(p))
    assert len(t.poll().lines) == 2
    with open(p, "wb") as f:  # verl FileLogger: "wb" truncates in place (same inode)
        f.write(line(21) + line(22) + line(23) + line(24))
    r = t.poll()
    assert "truncated" in r.events
    assert r.lines == [line(n).strip() for n in (21, 22, 23, 24)]


def test_shrinking_file_is_a_truncation(tmp_path):
    p = tmp_path / "run.jsonl"
    p.write_bytes(line(1) + line(2) + line(3))
    t = FileTail(str(p))
    t.poll()
    with open(p, "r+b") as f:
        f.truncate(0)
    assert "truncated" in t.poll().events
    with open(p, "ab") as f:
        f.write(line(1))
    assert t.poll().lines == [line(1).strip()]


def test_rotation_drains_the_old_file_then_follows_the_new(tmp_path):
    p = tmp_path / "run.jsonl"
    p.write_bytes(line(1))
    t = FileTail(str(p))
    t.poll()
    with open(p, "ab") as f:
        f.write(line(2))
    os.rename(p, tmp_path / "run.jsonl.1")
    p.write_bytes(line(3))
    r = t.poll()
    assert "rotated" in r.events
    assert r.lines == [line(2).strip(), line(3).strip()]


def test_overlong_line_is_skipped_whole_without_buffering_it(tmp_path):
    p = tmp_path / "run.jsonl"
    t = FileTail(str(p), max_line=1000)
    with open(p, "wb") as f:
        f.write(line(1) + b'{"step":2,"data":{"k":"' + b"x" * 5000)
    r = t.poll()
    assert r.lines == [line(1).strip()] and r.too_long == 1
    assert len(t._buf) == 0
    with open(p, "ab") as f:
        f.write(b"x" * (2 << 20) + b'"}}\n' + line(3))
    r = t.poll()
    assert r.lines == [line(3).strip()] and r.too_long == 0


def test_one_megabyte_line_within_the_limit_is_read(tmp_path):
    p = tmp_path / "run.jsonl"
    big = b'{"step":1,"data":{"k":"' + b"x" * (1 << 20) + b'"}}\n'
    p.write_bytes(big + line(2))
    t = FileTail(str(p), max_line=1 << 20)
    r = t.poll()
    assert r.too_long == 1 and r.lines == [line(2).strip()]
    t2 = FileTail(str(p), max_line=2 << 20)
    assert len(t2.poll().lines) == 2
