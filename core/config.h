/*
 * config.h - warrend configuration.
 *
 * Precedence: embedded defaults (equal to conf/warren.conf), then the
 * config file, then command-line flags. The file format is `key = value`
 * lines, `#` comments. Strings are owned by the struct (cfg_free).
 */
#ifndef WARREN_CONFIG_H
#define WARREN_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct srv_config {
    char *listen_addr; /* listen = 127.0.0.1:8080 */
    unsigned listen_port;
    char *state_dir;            /* state_dir: LMDB index, api key, sandboxes' run dirs */
    char *api_key;              /* api_key: empty = generate/read state_dir/api_key */
    char *image_dir;            /* image_dir: vmlinux, initramfs, <template>.ext4 */
    char *qemu;                 /* qemu = qemu-system-x86_64 */
    char *accel;                /* accel = auto | kvm | tcg */
    char *log_level;            /* log_level = info */
    unsigned max_sandboxes;     /* max_sandboxes = 32 */
    unsigned default_memory_mb; /* default_memory_mb = 256 */
    unsigned min_memory_mb;     /* min_memory_mb = 128 */
    unsigned max_memory_mb;     /* max_memory_mb = 4096 */
    unsigned default_vcpus;     /* default_vcpus = 1 */
    unsigned max_vcpus;         /* max_vcpus = 4 */
    unsigned default_ttl_s;     /* default_ttl_seconds = 300 */
    unsigned max_ttl_s;         /* max_ttl_seconds = 86400 */
    unsigned default_idle_s;    /* default_idle_timeout_seconds = 300 */
    unsigned boot_timeout_s;    /* boot_timeout_seconds = 60 */
    unsigned ended_keep_s;      /* ended_retention_seconds = 600 */
    size_t max_body_bytes;      /* max_json_body_bytes = 1048576 */
    size_t exec_max_output;     /* exec_max_output_bytes = 16777216 (JSON mode) */
    unsigned tcg_tb_mib;        /* tcg_translation_cache_mb = 128 */
    unsigned tcg_huge_pages;    /* tcg_huge_pages = false (0/1) */
    size_t console_max_bytes;   /* console_log_bytes = 1048576 */
    char *default_template;     /* default_template = base */
    char *kernel_append;        /* kernel_append = (empty): extra guest kernel command line */
    /* Limits on clients and resources. */
    unsigned max_connections;     /* max_connections = 4096: open HTTP connections in total */
    unsigned max_conn_per_client; /* max_connections_per_client = 256: per client address */
    unsigned header_timeout_s;    /* header_timeout_seconds = 10: to send a request's headers */
    unsigned stall_timeout_s;     /* stream_stall_timeout_seconds = 60: streamed answer unread */
    unsigned http_timeout_s;      /* 30, no key: lws's body, header-read and idle timeouts
                                   * (the HTTP layer's tests shorten it) */
    unsigned max_ops_per_sbx;     /* max_operations_per_sandbox = 64: concurrent operations */
    unsigned max_ops_total;       /* max_operations = 1024: concurrent operations, all sandboxes */
    size_t max_env_meta_bytes;    /* max_env_metadata_bytes = 65536: env + metadata at create */
    unsigned mem_reserve_mb;      /* memory_reserve_mb = 1024: host memory kept from guests */
    unsigned min_free_disk_mb;    /* min_free_disk_mb = 1024: in state_dir, for create/upload */
    /* a hostile guest */
    unsigned violations_max;   /* protocol_violations_max = 5: then the sandbox is dead */
    unsigned list_max_entries; /* list_max_entries = 10000 */
    size_t chan_send_max;      /* channel_send_buffer_bytes = 8388608 */
    size_t list_max_bytes;     /* list_max_bytes = 4194304 */
    /* QEMU in a jail */
    size_t qemu_log_bytes;         /* qemu_log_bytes = 262144 */
    char *jail;                    /* jail = auto | required | off */
    unsigned jail_uid_base;        /* jail_uid_base = 200000 */
    unsigned jail_uid_count;       /* jail_uid_count = 10000 */
    char *jail_cgroup;             /* jail_cgroup = warren */
    char *jail_uid_lock_dir;       /* jail_uid_lock_dir = /run/warren/uids */
    unsigned jail_mem_overhead_mb; /* jail_memory_overhead_mb = 256 */
    unsigned jail_pids_max;        /* jail_pids_max = 512 */
    unsigned allow_tcg;            /* allow_tcg = false (0/1) */
    /* processes that belong to the sandbox */
    size_t process_ring_bytes;  /* process_ring_bytes = 1048576: output kept per process */
    unsigned max_procs_per_sbx; /* max_processes_per_sandbox = 64: background + PTYs */
    /* file watches (each is a background process of the sandbox) */
    unsigned watch_max_per_sbx; /* watch_max_per_sandbox = 8: running watches */
    unsigned watch_max_dirs;    /* watch_max_dirs = 8192: directories one watch watches */
    unsigned watch_coalesce_ms; /* watch_coalesce_ms = 100: writes of one file folded */
    size_t watch_line_max;      /* watch_line_max_bytes = 65536: one event line from the guest */
    size_t upload_gzip_max;     /* upload_gzip_max_bytes = 1073741824: a gzip upload, inflated */
    /* browser access */
    char *allowed_origins; /* allowed_origins = (empty): Origins browser sockets may come from */
    /* the agent socket */
    unsigned sess_max_sockets;  /* session_max_sockets_per_sandbox = 16 */
    unsigned sess_max_requests; /* session_max_requests = 64: in flight per socket */
    size_t sess_max_frame;      /* session_max_frame_bytes = 1114112: one client message */
    size_t sess_send_queue;     /* session_send_queue_bytes = 1048576: then credit waits */
    /* the PTY WebSocket */
    size_t pty_max_frame;       /* pty_socket_max_frame_bytes = 65537: client frame */
    unsigned pty_socks_per_sbx; /* pty_sockets_per_sandbox = 64 */
    unsigned pty_viewers;       /* pty_viewers_per_process = 16 */
    unsigned pty_ctl_queue;     /* pty_socket_input_queue = 64: frames waiting per socket */
    size_t pty_send_queue;      /* pty_socket_send_queue_bytes = 2097152: frames for the client */
    /* Jupyter's kernel API (server/jupyter*.c) */
    char *jup_kernelspecs;         /* jupyter_kernelspecs = python3=code-interpreter */
    size_t jup_max_msg;            /* jupyter_max_message_bytes = 16777216: one message */
    size_t jup_send_queue;         /* jupyter_send_queue_bytes = 4194304: then credit waits */
    size_t jup_in_queue;           /* jupyter_input_queue_bytes = 16777216: then reading waits */
    unsigned jup_socks_per_kernel; /* jupyter_sockets_per_kernel = 8 */
    unsigned
        jup_memory_mb; /* jupyter_kernel_memory_mb = 0: a kernel's sandbox (0: its template's) */
    /* code contexts and runs (klink.h) */
    size_t run_max_line;       /* run_code_max_line_bytes = 16777216: one NDJSON line of a run */
    size_t run_max_gather;     /* run_code_max_gather_bytes = 33554432: a JSON-mode answer */
    unsigned run_keepalive_ms; /* run_code_keepalive_ms = 5000: silence before a keepalive */
    /* the browser terminal */
    char *web_dir; /* web_dir: node_modules holding @xterm/xterm and @xterm/addon-fit */
    /* idle freeze */
    unsigned freeze_after_ms; /* freeze_after_ms = 30000: idle time before a VM is stopped; 0 off */
    unsigned freeze_pageout_after_ms; /* = 300000: frozen this long, to swap; 0 off */
    /* template snapshots and the warm pool */
    unsigned pool_size;   /* pool_size = 0: ready VMs kept per template (0: every create boots) */
    unsigned pool_max_mb; /* pool_max_mb = 1024: memory the pool may hold (see conf) */
    unsigned pool_spares; /* pool_spares = 1: QEMUs started ahead for clones and forks */
    unsigned pool_spare_prefault_mb; /* pool_spare_prefault_mb = 12: TCG buffer touched ahead */
    char *pool_template_warmup;      /* pool_template_warmup: sh -c command run before its save */
    char *pool_templates;            /* pool_templates: more templates pooled from the start */
    unsigned pool_on_first_use;      /* pool_on_first_use = true (0/1): pool a template when used */
    unsigned pool_max_templates;     /* pool_max_templates = 4: templates (and shapes) pooled */
    /* templates: other names, their own memory default, the warm hook's bound */
    char *template_aliases;   /* template_aliases = code-interpreter-v1=code-interpreter */
    char *template_memory_mb; /* template_memory_mb = code-interpreter=768: memory_mb default */
    unsigned template_warm_timeout_s; /* template_warm_timeout_seconds = 600: /etc/warren/warm */
    unsigned mem_overcommit_pct;      /* memory_overcommit_percent = 100: guests' memory_mb may add
                                       * up to this share of host memory less the reserve */
    /* sandbox networking (net/net.h) */
    unsigned net_enabled;          /* net_enabled = false (0/1): no NIC at all when off */
    unsigned net_default_internet; /* net_default_internet = true (0/1): create's default */
    char *net_uplink;              /* net_uplink = (empty): interface NATed out of */
    char *net_range;               /* net_range = 10.201.0.0/16: host-side /30 per VM */
    char *net_dns_upstream;        /* net_dns_upstream = (empty): IPv4 resolver guests use */
    unsigned net_ahead;            /* net_ahead = 2: namespaces made ahead for cold creates */
    /* snapshots, fork */
    unsigned fork_max;           /* fork_max = 16: sandboxes one fork request may make */
    unsigned paused_retention_s; /* paused_retention_s = 604800: then a paused one is deleted */
    /* per-sandbox network limits: a create's defaults, 0 = unlimited */
    unsigned net_rate_mbit;       /* net_rate_mbit = 0: Mbit/s each way (tc tbf) */
    unsigned net_max_connections; /* net_max_connections = 0: concurrent connections out */
    /* sandbox ports through warrend (server/ports.h) */
    char *port_domain; /* port_domain = (empty): Host {port}-{id}.{domain}; empty off */
    /* E2B's template names -> Warren's, "name=template" pairs apart by spaces (e2b_api.c) */
    char *e2b_templates;         /* e2b_templates = code-interpreter-v1=code-interpreter */
    size_t port_buf_bytes;       /* port_buffer_bytes = 262144: per direction per connection */
    unsigned port_conns_per_sbx; /* port_connections_per_sandbox = 64 */
    unsigned port_conns;         /* port_connections = 1024: proxied connections in all */
    unsigned port_connect_ms;    /* port_connect_timeout_ms = 5000 */
    unsigned port_idle_s;        /* port_idle_timeout_s = 600: no byte either way: closed */
    /* several hosts behind HAProxy (deploy/) */
    char *host_id;                /* host_id = (empty): $WARREN_HOST_ID, else from the hostname */
    char *api_key_file;           /* api_key_file = (empty): the fleet's key, read from a file */
    char *token_secret_file;      /* token_secret_file = (empty): the fleet's token secret */
    unsigned fleet;               /* fleet = false (0/1): a full host answers 503 host_full */
    char *peers;                  /* peers = (empty): name=host:port,... lists ask them too */
    char *peers_dns;              /* peers_dns = (empty): name:port, its addresses are peers */
    unsigned peers_dns_period_s;  /* peers_dns_interval_seconds = 30: resolved this often */
    unsigned peer_timeout_ms;     /* peer_timeout_ms = 3000: a peer's answer to a list */
    size_t peer_answer_max_bytes; /* peer_answer_max_bytes = 16777216: its largest answer */
    unsigned agent_check_port;    /* agent_check_port = 0: HAProxy agent check on TCP; 0 off */
    /* guest images filled from a shared source (server/images_src.c) */
    char *image_source;              /* image_source = (empty): a directory or http:// URL; off */
    unsigned image_source_period_s;  /* image_source_interval_seconds = 60: index re-read */
    size_t image_source_max_bytes;   /* image_source_max_bytes = 17179869184: a file's largest */
    unsigned image_source_timeout_s; /* image_source_timeout_seconds = 30: HTTP connect, read */
    /* E2B's in-sandbox API (server/envd.c) */
    unsigned e2b_stream_timeout_ms; /* e2b_stream_timeout_ms = 60000: a stream's deadline */
};

#define CFG_HOST_ID_MAX 12 /* characters of a host id: a-z 0-9 */

/* Fill with the embedded defaults. state_dir defaults to $XDG_STATE_HOME/warren,
 * ~/.local/state/warren, or /var/lib/warren for root. image_dir to
 * $WARREN_IMAGE_DIR or ~/.cache/warren/images/current. web_dir to $WARREN_WEB_DIR or
 * ~/.cache/warren/npm/current/node_modules (where scripts/setup.sh installs). 0 or -ENOMEM. */
int cfg_defaults(struct srv_config *c);
/* Apply a config file. 0, or -EINVAL with a message "FILE:LINE: ..." in err. */
int cfg_load_file(struct srv_config *c, const char *path, char *err, size_t errcap);
/* The value of name in a map option ("a=b c=d", template_aliases, template_memory_mb),
 * copied to out; NULL when name has none (or it does not fit in cap). */
const char *cfg_tmap_get(const char *map, const char *name, char *out, size_t cap);
/* A create's memory_mb default for a template: template_memory_mb's, else
 * default_memory_mb. */
unsigned cfg_template_memory_mb(const struct srv_config *c, const char *tmpl);
/* Apply one key = value (used by the file parser and for flags). */
int cfg_set(struct srv_config *c, const char *key, const char *value, char *err, size_t errcap);
void cfg_free(struct srv_config *c);
/* Is id a valid host id (1..CFG_HOST_ID_MAX of a-z 0-9)? */
bool cfg_host_id_valid(const char *id);
/* The host id a machine or pod name gives ("warren-2" -> "h2"). 0, or -EINVAL when the
 * name has no letter or digit. */
int cfg_host_id_from_name(const char *name, char out[CFG_HOST_ID_MAX + 1]);
/* Settle host_id after the file and flags: an empty one comes from $WARREN_HOST_ID, else
 * the hostname. 0, or -EINVAL (message in err) for an invalid one. */
int cfg_resolve_host_id(struct srv_config *c, char *err, size_t errcap);

#endif
