# Warren on Nomad: a system job, one warrend on every client node that has
# KVM (node.meta.warren_kvm = "true" in the client's configuration), run by
# the raw_exec driver as root because warrend starts QEMU, tap devices,
# network namespaces and cgroups itself. The host id is the node's name (its
# letters and digits, lowercased, cut to 12: keep them distinct). The fleet's
# API key and token secret come from Nomad Variables at
# nomad/jobs/warren (keys api_key and token_secret, 64 hex digits).
#
#   nomad var put nomad/jobs/warren api_key=$(openssl rand -hex 32) \
#       token_secret=$(openssl rand -hex 32)
#   nomad job run deploy/nomad/warren.nomad.hcl
#
# HAProxy in front: deploy/haproxy/warren-haproxy.py with one --host per node.

job "warren" {
  type        = "system"
  datacenters = ["dc1"]

  constraint {
    attribute = "${meta.warren_kvm}"
    value     = "true"
  }

  group "warrend" {
    network {
      mode = "host"
      port "api" {
        static = 8080
      }
      port "agent" {
        static = 8081
      }
    }

    service {
      name     = "warren"
      port     = "api"
      provider = "nomad"
      check {
        type     = "http"
        path     = "/healthz"
        interval = "5s"
        timeout  = "2s"
      }
    }

    task "warrend" {
      driver = "raw_exec"

      config {
        command = "/usr/local/bin/warrend"
        args    = ["-c", "${NOMAD_TASK_DIR}/warren.conf"]
      }

      env {
        WARREN_HOST_ID = "${node.unique.name}"
      }

      template {
        destination = "${NOMAD_TASK_DIR}/warren.conf"
        data        = <<EOT
listen = 0.0.0.0:8080
state_dir = /var/lib/warren
image_dir = /var/cache/warren/images/current
image_source = http://warren-images.service.consul:8000/v1
image_source_interval_seconds = 60
api_key_file = {{ env "NOMAD_SECRETS_DIR" }}/api_key
token_secret_file = {{ env "NOMAD_SECRETS_DIR" }}/token_secret
fleet = true
agent_check_port = 8081
max_sandboxes = 64
pool_size = 2
EOT
      }

      template {
        destination = "${NOMAD_SECRETS_DIR}/api_key"
        perms       = "0600"
        data        = "{{ with nomadVar \"nomad/jobs/warren\" }}{{ .api_key }}{{ end }}"
      }

      template {
        destination = "${NOMAD_SECRETS_DIR}/token_secret"
        perms       = "0600"
        data        = "{{ with nomadVar \"nomad/jobs/warren\" }}{{ .token_secret }}{{ end }}"
      }

      # warrend leaves VMs running on SIGTERM for the next warrend to adopt.
      kill_timeout = "30s"
      kill_signal  = "SIGTERM"

      resources {
        cpu    = 2000
        memory = 8192
      }
    }
  }
}
