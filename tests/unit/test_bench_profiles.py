"""`bench/_profiles.py`: py-spy's folded stacks summed by frame, self and inclusive (a frame that
stands twice in one stack, as a recursive call does, is counted once in that sample)."""

from __future__ import annotations

from pathlib import Path

from bench._profiles import frame_totals, profile_lines


def test_frames_are_summed_self_and_inclusive(tmp_path: Path) -> None:
    folded = tmp_path / "kvproxy.txt"
    folded.write_text(
        "main (a.py);loop (b.py);write (c.py) 6\n"
        "main (a.py);loop (b.py);decide (d.py);decide (d.py) 3\n"
        "main (a.py) 1\n"
        "not a stack line\n"
    )
    own, inclusive, total = frame_totals(folded)
    assert total == 10
    assert own == {"write (c.py)": 6, "decide (d.py)": 3, "main (a.py)": 1}
    assert inclusive["main (a.py)"] == 10 and inclusive["loop (b.py)"] == 9
    assert inclusive["decide (d.py)"] == 3
    lines = profile_lines(folded, top=2)
    assert lines[0] == "kvproxy.txt: 10 samples holding the GIL"
    assert lines[-2:] == ["     60.0%  write (c.py)", "     30.0%  decide (d.py)"]
