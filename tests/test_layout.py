"""The tree tells the architecture: tests/ mirrors anex_agent/, and the README's layout table matches the folders.

Mirror rule (as python-websockets keeps it): every module ``anex_agent/<path>/<name>.py`` has a
test module ``tests/<path>/test_<name>.py`` (or ``test_<name>_<aspect>.py``, or
``test_<folder>_<name>.py``), or it is listed in :data:`COVERED_ELSEWHERE` with the tests that
cover it and why there. A module that gains its own test module leaves the list (a stale entry
fails), and every test path named in the list exists.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "anex_agent"

# module (path under anex_agent/) -> (tests that cover it, why there rather than a test module of its name)
COVERED_ELSEWHERE = {
    'admin/api.py': (('tests/admin/',), "through the package's entry points (commands, services), not imported by name"),
    'admin/output.py': (('tests/admin/',), "through the package's entry points (commands, services), not imported by name"),
    'admin/resources.py': (('tests/coordinator/test_readme_commands.py',), 'exercises it directly'),
    'agent/cli_cleanup.py': (('tests/agent/',), "through the package's entry points (commands, services), not imported by name"),
    'agent/cli_daemon.py': (('tests/agent/',), "through the package's entry points (commands, services), not imported by name"),
    'agent/cli_detect.py': (('tests/test_unprivileged.py',), 'exercises it directly'),
    'agent/cli_run.py': (('tests/agent/test_pid1.py', 'tests/test_parse.py',), 'exercises it directly'),
    'agent/container_state.py': (('tests/agent/test_pid1.py',), 'exercises it directly'),
    'agent/logs.py': (('tests/agent/test_workload_logs.py', 'tests/coordinator/test_node_logs.py',), 'exercises it directly'),
    'agent/logs_api.py': (('tests/agent/test_workload_logs.py', 'tests/coordinator/test_node_logs.py',), 'exercises it directly'),
    'agent/probe_spec.py': (('tests/agent/test_probes.py', 'tests/virtualnode/test_podspec.py'), 'the probe specification is read where probes run and where pods are translated'),
    'agent/reaper.py': (('tests/agent/test_pid1.py',), 'exercises it directly'),
    'agent/run_options.py': (('tests/agent/test_pid1.py', 'tests/agent/test_restart_policy.py',), 'exercises it directly'),
    'agent/supervisor.py': (('tests/agent/test_agent_credentials.py', 'tests/agent/test_agent_join.py',), 'exercises it directly'),
    'client/join_token.py': (('tests/agent/test_agent_join.py',), 'exercises it directly'),
    'client/link.py': (('tests/client/',), "through the package's entry points (commands, services), not imported by name"),
    'coordinator/app.py': (('tests/agent/test_agent_credentials.py', 'tests/coordinator/test_abuse.py',), 'exercises it directly'),
    'coordinator/auth.py': (('tests/coordinator/test_abuse.py', 'tests/coordinator/test_credential_cache.py',), 'exercises it directly'),
    'coordinator/changes.py': (('tests/coordinator/test_abuse.py', 'tests/coordinator/test_change_log.py',), 'exercises it directly'),
    'coordinator/context.py': (('tests/agent/test_agent_credentials.py', 'tests/coordinator/test_abuse.py',), 'exercises it directly'),
    'coordinator/coordinator_key.py': (('tests/coordinator/test_proof.py', 'tests/coordinator/test_registered_key.py',), 'exercises it directly'),
    'coordinator/enrollment.py': (('tests/coordinator/test_abuse.py', 'tests/coordinator/test_proof.py',), 'exercises it directly'),
    'coordinator/gateways.py': (('tests/coordinator/test_gateway_presence.py',), 'exercises it directly'),
    'coordinator/gatewayset.py': (('tests/coordinator/test_api.py',), 'served over HTTP by the REST API tests'),
    'coordinator/heartbeats.py': (('tests/coordinator/test_heartbeat_flush.py',), 'exercises it directly'),
    'coordinator/key_file.py': (('tests/coordinator/test_api.py',), 'served over HTTP by the REST API tests'),
    'coordinator/limits.py': (('tests/coordinator/test_abuse.py', 'tests/coordinator/test_openapi_rules.py',), 'exercises it directly'),
    'coordinator/metrics.py': (('tests/coordinator/test_abuse.py',), 'exercises it directly'),
    'coordinator/migrations.py': (('tests/coordinator/test_change_log.py', 'tests/coordinator/test_db.py',), 'exercises it directly'),
    'coordinator/nodes.py': (('tests/coordinator/test_credential_cache.py',), 'exercises it directly'),
    'coordinator/problems.py': (('tests/coordinator/test_api.py',), 'served over HTTP by the REST API tests'),
    'coordinator/provisioning/boot.py': (('tests/coordinator/test_provisioning.py',), 'driven through the provisioning routes'),
    'coordinator/provisioning/bootstrap.py': (('tests/coordinator/test_bootstrap.py',), 'exercises it directly'),
    'coordinator/provisioning/config.py': (('tests/coordinator/test_provisioning_selector.py',), 'exercises it directly'),
    'coordinator/provisioning/costs.py': (('tests/coordinator/test_provisioning.py',), 'driven through the provisioning routes'),
    'coordinator/provisioning/policy.py': (('tests/coordinator/test_provisioning_recovery.py',), 'exercises it directly'),
    'coordinator/provisioning/ready.py': (('tests/coordinator/test_provisioning_recovery.py',), "through the provisioning loop's checks of ready nodes"),
    'coordinator/provisioning/reconciler.py': (('tests/coordinator/test_provisioning.py', 'tests/coordinator/test_provisioning_recovery.py',), "through the provisioning loop's reconciliations"),
    'coordinator/provisioning/recovery.py': (('tests/coordinator/test_provisioning_recovery.py',), 'exercises it directly'),
    'coordinator/provisioning/registry_auth.py': (('tests/coordinator/test_provisioning.py',), 'exercises it directly'),
    'coordinator/provisioning/selector.py': (('tests/coordinator/test_provisioning_selector.py',), 'exercises it directly'),
    'coordinator/provisioning/steps.py': (('tests/coordinator/test_provisioning.py', 'tests/coordinator/test_provisioning_recovery.py',), 'driven through the provisioning routes'),
    'coordinator/provisioning/store.py': (('tests/coordinator/test_provisioning.py',), 'exercises it directly'),
    'coordinator/provisioning/transitions.py': (('tests/coordinator/test_provisioning.py', 'tests/coordinator/test_provisioning_recovery.py',), 'driven through the provisioning routes'),
    'coordinator/routes/agent_download.py': (('tests/coordinator/test_bootstrap.py',), 'exercises it directly'),
    'coordinator/routes/fleet_metrics.py': (('tests/coordinator/test_abuse.py', 'tests/coordinator/test_fleet_metrics.py',), 'exercises it directly'),
    'coordinator/routes/gateways.py': (('tests/coordinator/test_api.py',), 'served over HTTP by the REST API tests'),
    'coordinator/routes/labels.py': (('tests/coordinator/test_api.py',), 'served over HTTP by the REST API tests'),
    'coordinator/routes/modules.py': (('tests/coordinator/provisioning_fakes.py',), 'a test helper drives it for the tests beside it'),
    'coordinator/routes/node_actions.py': (('tests/coordinator/test_api.py',), 'served over HTTP by the REST API tests'),
    'coordinator/routes/node_logs.py': (('tests/coordinator/test_api.py',), 'served over HTTP by the REST API tests'),
    'coordinator/routes/nodes.py': (('tests/coordinator/test_api.py',), 'served over HTTP by the REST API tests'),
    'coordinator/routes/ops.py': (('tests/coordinator/test_api.py',), 'served over HTTP by the REST API tests'),
    'coordinator/routes/provisions.py': (('tests/coordinator/test_provisioning.py', 'tests/coordinator/test_provisioning_recovery.py',), 'exercises it directly'),
    'coordinator/routes/registry.py': (('tests/coordinator/test_openapi_rules.py',), 'exercises it directly'),
    'coordinator/routes/selection.py': (('tests/selection/test_api.py', 'tests/selection/test_worker.py',), 'exercises it directly'),
    'coordinator/routes/ssh.py': (('tests/coordinator/test_api.py',), 'served over HTTP by the REST API tests'),
    'coordinator/routes/tokens.py': (('tests/coordinator/test_api.py',), 'served over HTTP by the REST API tests'),
    'coordinator/routes/watch.py': (('tests/coordinator/test_api.py',), 'served over HTTP by the REST API tests'),
    'coordinator/server.py': (('tests/coordinator/test_strict_input.py',), 'exercises it directly'),
    'coordinator/settings.py': (('tests/agent/test_agent_credentials.py', 'tests/coordinator/test_abuse.py',), 'exercises it directly'),
    'coordinator/signing.py': (('tests/coordinator/test_registered_key.py',), 'exercises it directly'),
    'coordinator/ssh_ca.py': (('tests/coordinator/test_ssh_certificates.py',), 'exercises it directly'),
    'coordinator/ssh_certs.py': (('tests/coordinator/test_api.py',), 'served over HTTP by the REST API tests'),
    'coordinator/sweeper.py': (('tests/agent/test_agent_credentials.py', 'tests/coordinator/test_credential_cache.py',), 'exercises it directly'),
    'coordinator/tls.py': (('tests/coordinator/test_cli_secrets_tls.py',), 'exercises it directly'),
    'coordinator/tokens.py': (('tests/coordinator/test_api.py',), 'served over HTTP by the REST API tests'),
    'coordinator/versions.py': (('tests/coordinator/test_api.py',), 'served over HTTP by the REST API tests'),
    'demo/observe.py': (('integration/test_demo.py',), 'needs real processes in network namespaces'),
    'demo/provision.py': (('tests/demo/test_kubernetes.py',), 'exercises it directly'),
    'frontends/dial_guard.py': (('tests/frontends/test_proxy_guards.py', 'tests/frontends/test_socks5.py'), 'through both proxies, which refuse the same destinations'),
    'frontends/relay.py': (('tests/frontends/test_forward.py', 'tests/frontends/test_forward_idle.py',), 'exercises it directly'),
    'frontends/tcp_server.py': (('tests/frontends/test_proxy.py', 'tests/frontends/test_socks5.py'), 'through both proxies served on it'),
    'gateway/cli.py': (('tests/gateway/test_gateway_settings_secrets.py',), 'exercises it directly'),
    'gateway/forwarding.py': (('integration/test_gateway_rules.py',), 'needs real processes in network namespaces'),
    'gateway/link.py': (('tests/gateway/',), "through the package's entry points (commands, services), not imported by name"),
    'gateway/nft.py': (('tests/gateway/test_rules_and_peers.py',), 'exercises it directly'),
    'gateway/peers.py': (('tests/gateway/test_incremental_apply.py', 'tests/gateway/test_metrics.py',), 'exercises it directly'),
    'gateway/service.py': (('tests/gateway/test_gateway_coordinator.py', 'tests/gateway/test_gateway_route_refused.py',), 'exercises it directly'),
    'gpu/qualify_cli.py': (('tests/gpu/test_gpm.py', 'tests/gpu/test_qualify.py',), 'exercises it directly'),
    'gpu/sampler.py': (('tests/gpu/test_inventory_sampler.py', 'tests/gpu/test_real_gpu.py',), 'exercises it directly'),
    'gpu/telemetry.py': (('tests/selection/test_onprem_bans_purity.py',), 'exercises it directly'),
    'net/relay_protocol.py': (('tests/tunnels/binds/test_ws.py',), 'exercises it directly'),
    'netstack/aio.py': (('tests/netstack/test_engine_stack.py', 'tests/netstack/test_tcp.py',), 'through the stack and its asyncio adapter'),
    'netstack/checksum.py': (('tests/netstack/test_packets.py',), 'exercises it directly'),
    'netstack/dialer.py': (('tests/netstack/test_engine_stack.py', 'tests/netstack/test_tcp.py',), 'through the stack and its asyncio adapter'),
    'netstack/icmp.py': (('tests/netstack/test_packets.py',), 'exercises it directly'),
    'netstack/ipv4.py': (('tests/netstack/test_packets.py',), 'exercises it directly'),
    'netstack/stack.py': (('tests/netstack/test_packets.py',), 'exercises it directly'),
    'netstack/tcp/autotune.py': (('tests/netstack/test_longpipe.py',), 'the long-path algorithms are tested together, alone and on the fake link'),
    'netstack/tcp/cubic.py': (('tests/netstack/test_longpipe.py',), 'the long-path algorithms are tested together, alone and on the fake link'),
    'netstack/tcp/pacing.py': (('tests/netstack/test_longpipe.py',), 'the long-path algorithms are tested together, alone and on the fake link'),
    'netstack/tcp/rack.py': (('tests/netstack/test_longpipe.py',), 'the long-path algorithms are tested together, alone and on the fake link'),
    'netstack/tcp/timestamps.py': (('tests/netstack/test_longpipe.py',), 'the long-path algorithms are tested together, alone and on the fake link'),
    'netstack/tcp/connection.py': (('tests/netstack/test_tcp.py',), 'exercises it directly'),
    'netstack/tcp/events.py': (('tests/netstack/test_tcp.py',), 'a connection driven through its events alone, and every pair over the fake link'),
    'netstack/tcp/receiver.py': (('tests/netstack/test_tcp.py', 'tests/netstack/test_longpipe.py'), "the connection's receive path, exercised through the connection"),
    'netstack/tcp/recovery.py': (('tests/netstack/test_tcp.py', 'tests/netstack/test_longpipe.py'), "the connection's loss recovery, exercised through the connection"),
    'netstack/tcp/sender.py': (('tests/netstack/test_tcp.py', 'tests/netstack/test_longpipe.py'), "the connection's send path, exercised through the connection"),
    'netstack/tcp/states.py': (('tests/netstack/test_tcp.py',), 'names only, used by every connection test'),
    'netstack/tcp/reassembly.py': (('tests/netstack/test_packets.py',), 'exercises it directly'),
    'netstack/tcp/rtt.py': (('tests/netstack/test_engine_stack.py', 'tests/netstack/test_tcp.py',), 'through the stack and its asyncio adapter'),
    'netstack/tcp/scoreboard.py': (('tests/netstack/test_packets.py',), 'exercises it directly'),
    'netstack/tcp/segment.py': (('tests/netstack/test_engine_stack.py', 'tests/netstack/test_tcp.py',), 'through the stack and its asyncio adapter'),
    'netstack/udp.py': (('tests/netstack/test_packets.py',), 'exercises it directly'),
    'providers/offers.py': (('tests/selection/test_providers.py',), 'the offer-source protocol; every source is tested there'),
    'providers/offers_http.py': (('tests/coordinator/test_rental_providers.py', 'tests/selection/test_api.py',), 'exercises it directly'),
    'providers/onprem.py': (('tests/selection/test_onprem_bans_purity.py', 'tests/selection/test_providers.py',), 'exercises it directly'),
    'providers/rentals.py': (('tests/coordinator/test_provisioning.py', 'tests/coordinator/test_provisioning_recovery.py',), 'exercises it directly'),
    'providers/rentals_http.py': (('tests/coordinator/test_rental_providers.py',), 'through both rental clients'),
    'providers/runpod/offers.py': (('tests/coordinator/test_rental_providers.py', 'tests/selection/test_api.py',), 'exercises it directly'),
    'providers/runpod/rentals.py': (('tests/coordinator/test_provisioning_recovery.py', 'tests/coordinator/test_rental_providers.py',), 'exercises it directly'),
    'providers/vastai/offers.py': (('tests/coordinator/test_provisioning_selector.py', 'tests/coordinator/test_rental_providers.py',), 'exercises it directly'),
    'providers/vastai/rentals.py': (('tests/coordinator/test_provisioning_recovery.py', 'tests/coordinator/test_rental_providers.py',), 'exercises it directly'),
    'remote/cp_client.py': (('tests/coordinator/test_ssh_client_cli.py', 'tests/coordinator/test_ssh_end_to_end.py',), 'exercises it directly'),
    'remote/ssh_access.py': (('tests/agent/test_ssh_watch.py', 'tests/coordinator/test_ssh_end_to_end.py',), 'exercises it directly'),
    'remote/ssh_process.py': (('tests/remote/test_ssh_server.py',), 'through the SSH server sessions'),
    'remote/ssh_pty.py': (('tests/remote/test_ssh_server.py',), 'through the SSH server sessions'),
    'remote/ssh_session.py': (('tests/remote/test_ssh_server.py', 'tests/coordinator/test_ssh_end_to_end.py',), 'through the SSH server sessions'),
    'remote/ssh_sftp.py': (('tests/remote/test_ssh_server.py',), 'exercises it directly'),
    'remote/ssh_sftp_child.py': (('tests/remote/test_ssh_server.py',), 'through the SSH server sessions'),
    'selection/bans.py': (('tests/coordinator/test_provisioning.py', 'tests/coordinator/test_provisioning_recovery.py',), 'exercises it directly'),
    'selection/filters.py': (('tests/selection/test_doc_examples.py', 'tests/selection/test_properties.py',), 'exercises it directly'),
    'selection/labels.py': (('tests/selection/test_qualification_labels.py',), 'exercises it directly'),
    'selection/models.py': (('tests/selection/',), "through the package's entry points (commands, services), not imported by name"),
    'selection/offers.py': (('tests/selection/test_properties.py', 'tests/selection/test_providers.py',), 'exercises it directly'),
    'selection/service.py': (('tests/selection/test_providers.py', 'tests/selection/test_rank_explain.py',), 'exercises it directly'),
    'selection/units.py': (('tests/selection/test_regions_versions.py',), 'exercises it directly'),
    'selection/versions.py': (('tests/selection/test_doc_examples.py', 'tests/selection/test_properties.py',), 'exercises it directly'),
    'selection/worker_process.py': (('tests/selection/test_worker.py',), 'exercises it directly'),
    'telemetry/exposition.py': (('tests/gpu/test_exposition.py',), 'through the agent and fleet renderers'),
    'telemetry/models.py': (('tests/coordinator/test_provisioning_recovery.py', 'tests/coordinator/test_provisioning_recovery_process.py',), 'exercises it directly'),
    'telemetry/options.py': (('tests/gpu/test_dashboard.py', 'tests/gpu/test_gpm.py',), 'exercises it directly'),
    'testing/fake_nvml.py': (('tests/coordinator/test_fleet_metrics.py', 'tests/gpu/test_dashboard.py',), 'exercises it directly'),
    'testing/fake_providers.py': (('tests/coordinator/test_provisioning_process.py', 'tests/coordinator/test_provisioning_recovery_process.py',), 'exercises it directly'),
    'testing/kube.py': (('tests/demo/test_kubernetes.py',), 'exercises it directly'),
    'testing/memcg.py': (('tests/agent/test_pid1.py', 'integration/test_virtual_node.py',), 'makes the memory cgroups of the real OOM kills there (root)'),
    'testing/mesh.py': (('integration/test_agent_footprint.py', 'integration/test_agent_gateway_later_and_stop.py',), 'needs real processes in network namespaces'),
    'testing/netlab.py': (('tests/test_cli.py',), 'exercises it directly'),
    'testing/probe_client.py': (('integration/test_mesh.py',), 'runs inside network namespaces (root)'),
    'testing/services.py': (('tests/test_address_flags.py',), 'exercises it directly'),
    'tunnels/binds/base.py': (('tests/tunnels/binds/test_udp.py', 'tests/tunnels/binds/test_ws.py',), 'through the engine or binds built on it'),
    'tunnels/binds/relay_client.py': (('tests/tunnels/binds/test_ws.py', 'tests/gateway/test_relay_admission.py',), 'against a live in-process relay: the binds built on it and check_relay'),
    'tunnels/binds/relay_io.py': (('tests/tunnels/binds/test_ws.py', 'tests/gateway/test_relay_admission.py',), 'through both ends of the relay built on it, the client and the gateway relay'),
    'tunnels/binds/switch.py': (('tests/agent/test_path.py',), 'exercises it directly, where the path chooser steers it'),
    'tunnels/binds/udp_probe.py': (('tests/agent/test_path.py',), 'exercises it directly'),
    'tunnels/engines/cleanup.py': (('tests/test_unprivileged.py', 'tests/tunnels/engines/test_probes.py',), 'exercises it directly'),
    'tunnels/engines/detect.py': (('tests/tunnels/engines/test_engine_policy.py', 'tests/tunnels/engines/test_probe_in_loop.py',), 'exercises it directly'),
    'tunnels/engines/kernel.py': (('tests/gateway/test_incremental_apply.py', 'tests/tunnels/engines/test_engine_plans.py',), 'exercises it directly'),
    'tunnels/engines/status.py': (('tests/tunnels/engines/test_engine_policy.py', 'tests/agent/test_dataplane.py',), 'what the engines report, read through detect and the data plane'),
    'tunnels/engines/wireguard_go.py': (('tests/gateway/test_incremental_apply.py', 'tests/host/test_childenv.py',), 'exercises it directly'),
    'tunnels/engines/wireproxy_config.py': (('tests/tunnels/engines/test_wireproxy.py',), 'through the engine or binds built on it'),
    'tunnels/engines/wireproxy_metrics.py': (('tests/tunnels/engines/test_wireproxy.py',), 'through the engine or binds built on it'),
    'tunnels/engines/wireproxy_process.py': (('tests/agent/test_engine_frontends.py',), 'exercises it directly'),
    'tunnels/os/caps.py': (('tests/tunnels/engines/test_probe_in_loop.py', 'tests/tunnels/engines/test_probes.py',), 'exercises it directly'),
    'tunnels/os/netconf.py': (('tests/test_unprivileged.py', 'tests/tunnels/engines/test_probes.py',), 'exercises it directly'),
    'virtualnode/cli.py': (('tests/virtualnode/',), "through the package's entry points (commands, services), not imported by name"),
    'virtualnode/events.py': (('tests/virtualnode/',), "through the package's entry points (commands, services), not imported by name"),
    'virtualnode/kubelet/certs.py': (('tests/virtualnode/kubelet/test_tls.py',), 'exercises it directly'),
    'virtualnode/kubelet/context.py': (('tests/virtualnode/kubelet/test_auth.py', 'tests/virtualnode/kubelet/test_node_ssh.py',), 'exercises it directly'),
    'virtualnode/kubelet/locator.py': (('tests/virtualnode/kubelet/fakes.py',), 'a test helper drives it for the tests beside it'),
    'virtualnode/kubelet/logs.py': (('tests/virtualnode/kubelet/test_streams.py', 'tests/virtualnode/kubelet/test_server.py',), 'through the kubelet server and its streams'),
    'virtualnode/kubelet/podlist.py': (('tests/virtualnode/kubelet/test_streams.py', 'tests/virtualnode/kubelet/test_server.py',), 'through the kubelet server and its streams'),
    'virtualnode/kubelet/runner.py': (('tests/virtualnode/kubelet/test_tls.py',), 'exercises it directly'),
    'virtualnode/kubelet/stats.py': (('tests/virtualnode/kubelet/test_streams.py', 'tests/virtualnode/kubelet/test_server.py',), 'through the kubelet server and its streams'),
    'virtualnode/kubelet/streams/bridge.py': (('tests/virtualnode/kubelet/test_streams.py', 'tests/virtualnode/kubelet/test_server.py',), 'through the kubelet server and its streams'),
    'virtualnode/kubelet/streams/channels.py': (('tests/virtualnode/kubelet/test_channels.py',), 'exercises it directly'),
    'virtualnode/kubelet/streams/node_ssh.py': (('tests/virtualnode/kubelet/test_node_ssh.py',), 'exercises it directly'),
    'virtualnode/kubelet/streams/portforward.py': (('tests/virtualnode/kubelet/test_streams.py', 'tests/virtualnode/kubelet/test_server.py',), 'through the kubelet server and its streams'),
    'virtualnode/kubelet/streams/remotecommand.py': (('tests/virtualnode/kubelet/test_streams.py', 'tests/virtualnode/kubelet/test_server.py',), 'through the kubelet server and its streams'),
    'virtualnode/kubelet/streams/session.py': (('tests/virtualnode/kubelet/test_streams.py',), 'exercises it directly'),
    'virtualnode/kubelet/streams/spdy.py': (('tests/virtualnode/kubelet/test_spdy.py',), 'exercises it directly'),
    'virtualnode/kubelet/streams/spdy_dictionary.py': (('tests/virtualnode/kubelet/test_spdy.py',), 'exercises it directly'),
    'virtualnode/kubelet/streams/upgrade.py': (('tests/virtualnode/kubelet/test_streams.py', 'tests/virtualnode/kubelet/test_server.py',), 'through the kubelet server and its streams'),
    'virtualnode/kubelet/streams/websocket.py': (('tests/virtualnode/kubelet/test_streams.py', 'tests/virtualnode/kubelet/test_server.py',), 'through the kubelet server and its streams'),
    'virtualnode/refusal.py': (('tests/virtualnode/test_podspec.py', 'tests/virtualnode/test_podfiles.py'), 'through the pod translation that refuses'),
    'wg/constants.py': (('tests/wg/test_replay.py', 'tests/wg/test_timers.py',), 'exercises it directly'),
    'wg/cookie.py': (('tests/wg/test_known_answers.py',), 'exercises it directly'),
    'wg/handshake.py': (('tests/wg/test_known_answers.py',), 'exercises it directly'),
    'wg/peer.py': (('tests/wg/test_device.py', 'tests/wg/test_timers.py',), 'exercises it directly'),
    'wg/session.py': (('tests/wg/',), "through the package's entry points (commands, services), not imported by name"),
    'wire/gateways.py': (('tests/wire/test_reader.py', 'tests/gateway/test_state.py',), 'read by the tolerant reader tests and applied by the gateway tests'),
    'wire/join.py': (('tests/wire/test_base.py', 'tests/coordinator/test_join_token_limits.py', 'tests/coordinator/test_proof.py',), 'the Model rules on join tokens, and the join-token and proof routes over HTTP'),
    'wire/nodes.py': (('tests/wire/test_base.py', 'tests/wire/test_reader.py', 'tests/agent/test_agent_desired.py',), 'the Model rules and the tolerant reader on node models, and the agent turning a config into its data plane'),
    'wire/pod.py': (('tests/virtualnode/test_podspec.py', 'tests/agent/test_pod_files.py'), 'through both sides of the pod contract'),
    'wire/problem.py': (('tests/coordinator/test_openapi_rules.py', 'tests/coordinator/test_api.py',), 'the problem schema in /v1/openapi.json and the problem documents served over HTTP'),
    'wire/proof.py': (('tests/coordinator/test_proof.py',), 'exercises it directly'),
    'wire/provisioning.py': (('tests/coordinator/test_provisioning_client.py', 'tests/virtualnode/test_pods_controller.py',), 'exercises it directly'),
    'wire/route_policy.py': (('tests/agent/test_agent_desired.py', 'tests/coordinator/test_gateway_networks.py',), 'exercises it directly'),
    'wire/ssh.py': (('tests/agent/test_ssh_watch.py', 'tests/coordinator/test_ssh_certificates.py',), 'exercises it directly'),
    'wire/watch.py': (('tests/wire/test_reader.py', 'tests/coordinator/test_watch.py', 'tests/gateway/test_incremental_apply.py',), 'read by the tolerant reader tests, served by the watch tests, applied by the gateway tests'),
}


def _modules() -> list[Path]:
    return [p.relative_to(PACKAGE) for p in sorted(PACKAGE.rglob("*.py"))
            if p.name not in ("__init__.py", "__main__.py")]


def mirrored(module: Path, tests: Path = ROOT / "tests") -> bool:
    """Whether ``module`` (a path under anex_agent/) has a test module of its name."""
    folder = tests / module.parent
    name = module.stem
    if (folder / f"test_{name}.py").is_file():
        return True
    prefixes = (f"test_{name}_", f"test_{module.parent.name}_{name}_")
    return any(test.stem.startswith(prefixes) or test.stem == f"test_{module.parent.name}_{name}"
               for test in folder.glob("test_*.py"))


def test_the_mirror_rule_accepts_a_named_test_and_refuses_a_stray_one(tmp_path):
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "test_state.py").write_text("")
    (tmp_path / "agent" / "test_agent_metrics.py").write_text("")
    (tmp_path / "agent" / "test_workload_lifetime.py").write_text("")
    assert mirrored(Path("agent/state.py"), tmp_path)
    assert mirrored(Path("agent/metrics.py"), tmp_path)
    assert mirrored(Path("agent/workload.py"), tmp_path)
    assert not mirrored(Path("agent/supervisor.py"), tmp_path)
    assert not mirrored(Path("gateway/state.py"), tmp_path)


def test_every_module_has_a_test_module_of_its_name_or_says_where_it_is_covered():
    missing = [str(m) for m in _modules() if not mirrored(m) and str(m) not in COVERED_ELSEWHERE]
    assert missing == [], "add tests/<path>/test_<name>.py, or list the module in COVERED_ELSEWHERE with its reason"


def test_the_covered_elsewhere_list_is_current():
    modules = {str(m) for m in _modules()}
    gone = sorted(name for name in COVERED_ELSEWHERE if name not in modules)
    now_mirrored = sorted(name for name in COVERED_ELSEWHERE if name in modules and mirrored(Path(name)))
    absent = sorted(path for paths, _ in COVERED_ELSEWHERE.values() for path in paths if not (ROOT / path).exists())
    unexplained = sorted(name for name, (paths, why) in COVERED_ELSEWHERE.items() if not paths or not why.strip())
    assert (gone, now_mirrored, absent, unexplained) == ([], [], [], [])


def test_no_loose_test_module_outside_a_package_folder():
    """A test of a module in a package lives in that package's folder under tests/ (top-level tests are
    of the top-level modules, or of the whole product: the CLI, texts, images, units, privileges,
    and the programs and benchmark helpers the project builds for its tests)."""
    top_level = {p.stem for p in PACKAGE.glob("*.py")}
    whole_product = {"test_address_flags", "test_bench_flags", "test_bench_profiling", "test_image", "test_import_rules", "test_install_tools", "test_layout", "test_lossy_relay",
                     "test_product_text", "test_secret_flags_cli", "test_systemd_units", "test_unprivileged"}
    stray = sorted(p.name for p in (ROOT / "tests").glob("test_*.py")
                   if p.stem not in whole_product and p.stem.removeprefix("test_") not in top_level)
    assert stray == []


def test_the_readme_layout_table_names_every_package_folder_and_only_existing_paths():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Layout"):]
    table = table[: table.index("\n## ")] if "\n## " in table else table
    named = set(re.findall(r"`(anex_agent/[\w/]+?)/?`", table))
    folders = {f"anex_agent/{p.relative_to(PACKAGE).as_posix()}" for p in PACKAGE.iterdir()
               if p.is_dir() and (p / "__init__.py").is_file()}
    assert folders - named == set(), "a package folder the README's layout table does not name"
    assert [path for path in named if not (ROOT / path).exists() and not (ROOT / f"{path}.py").exists()] == []
