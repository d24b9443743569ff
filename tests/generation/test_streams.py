from __future__ import annotations

from infrastructure import sse


def test_sse_event_formats_id_event_and_json_data():
    assert sse.event({"delta": "hi"}, name="token", id=3) == b'id: 3\nevent: token\ndata: {"delta":"hi"}\n\n'


def test_sse_event_splits_multi_line_data_into_data_lines():
    assert sse.event("a\nb\r\nc") == b"data: a\ndata: b\ndata: c\n\n"


def test_sse_comment_is_a_colon_line_with_no_blank_line_after_it():
    assert sse.comment("ping") == b": ping\n"


def test_coalesced_merges_token_runs_keeping_the_last_sequence_number():
    from inference.streams import StreamEvent, coalesced

    events = [
        StreamEvent(1, "token", {"delta": "a"}),
        StreamEvent(2, "token", {"delta": "b"}),
        StreamEvent(3, "done", {}),
    ]
    assert list(coalesced(events)) == [StreamEvent(2, "token", {"delta": "ab"}), StreamEvent(3, "done", {})]
    assert list(coalesced([])) == []
