"""haproxy_runtime's parsing of HAProxy's own answers (captured from HAProxy 2.6.12, Debian 12's, the sandbox's
balancer): the admin state that `show stat`'s status hides while a server's health checks fail."""
from deployer.host.module_utils.haproxy_runtime import parse_servers_state, state_word

HEADER = ("1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight "
          "srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state "
          "srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port "
          "srv_check_addr srv_agent_addr srv_agent_port\n")


def line(name, admin):
    return f"2 llm 1 {name} 127.0.0.1 0 {admin} 1 1 2 8 2 0 6 0 0 0 - 9 - 0 0 - - 0\n"


def test_admin_state_is_read_from_its_bits_whatever_the_health():
    text = HEADER + line("a", 0) + line("b", 8) + line("c", 1) + line("d", 0x10) + line("e", 0x20 | 0x08) + "\n"
    assert parse_servers_state(text) == {"a": "ready", "b": "drain", "c": "maint", "d": "drain", "e": "maint"}
    assert state_word("DOWN") == "down"            # what show stat says of a drained server that is down


def test_an_answer_without_a_header_or_with_a_short_line_gives_nothing_for_it():
    assert parse_servers_state("") == {}
    assert parse_servers_state("No such backend.\n") == {}
    assert parse_servers_state(HEADER + "2 llm 1 a\n") == {}


def test_a_name_that_would_be_a_second_runtime_command_is_refused_before_the_socket(tmp_path):
    """HAProxy's runtime API runs ';'-separated commands: a backend or server name is a plain token or nothing is
    sent (issue 40, F15).  The socket path does not exist: a refusal that reached it would say so instead."""
    import pytest

    from deployer.host.module_utils.haproxy_runtime import RuntimeError_, servers, set_state
    sock = str(tmp_path / "none.sock")
    for call in (lambda: servers(sock, "gpu; shutdown frontend api"),
                 lambda: set_state(sock, "gpu", "h1; disable server gpu/h2", "drain"),
                 lambda: set_state(sock, "gpu", "h1\nshow env", "drain")):
        with pytest.raises(RuntimeError_) as e:
            call()
        assert "none.sock" not in str(e.value) and ("expected letters" in str(e.value) or "U+000A" in str(e.value))
