/*
 * cli_keys.c - `keyflow keys create|list|revoke`: the Keys service.
 *
 * A grant is written SCOPE or SCOPE=PREFIX on the command line
 * ("events:send=orders-"): the scope, optionally limited to workflow or
 * function names starting with PREFIX. The server checks the scope names
 * and which scopes take a prefix (invariant 3 of keyflow.c).
 */
#include <stdio.h>
#include <string.h>

#include "base/limits.h"
#include "cli.h"

#define FLAGS(a) a, sizeof a / sizeof a[0]

static const kf__cli_flag_t create_flags[] = {
    {"--name", KF__CLI_VALUE, "TEXT", "what the key is for (required)"},
    {"--scope", KF__CLI_LIST, "SCOPE[=PREFIX]",
     "a grant, repeatable: events:send, coordinators:read, coordinators:write, runs:work, "
     "runs:read, functions:admin, functions:push, functions:read, functions:serve, "
     "metrics:read, keys:admin; =PREFIX limits it to names starting with PREFIX"},
};

static int cmd_create(kf__cli_t *cli, const kf__cli_args_t *args) {
    const char *name;
    int rc = kf__cli_require(args, "--name", &name);
    if (rc != KF__CLI_EXIT_OK) {
        return rc;
    }
    const char *scopes[KF_GRANTS_MAX + 1];
    size_t n = kf__cli_list(args, "--scope", scopes, KF_GRANTS_MAX + 1);
    if (n == 0) {
        return kf__cli_usage_error(args->command, "--scope SCOPE[=PREFIX] is required");
    }
    if (n > KF_GRANTS_MAX) {
        return kf__cli_usage_error(args->command, "--scope: at most %d grants", KF_GRANTS_MAX);
    }
    Keyflow__V1__Grant grants[KF_GRANTS_MAX];
    Keyflow__V1__Grant *ptrs[KF_GRANTS_MAX];
    for (size_t i = 0; i < n; i++) {
        keyflow__v1__grant__init(&grants[i]);
        const char *eq = strchr(scopes[i], '=');
        grants[i].scope = eq != NULL
                              ? kf_arena_strndup(&cli->arena, scopes[i], (size_t)(eq - scopes[i]))
                              : (char *)scopes[i];
        grants[i].prefix = eq != NULL ? (char *)eq + 1 : "";
        ptrs[i] = &grants[i];
    }
    Keyflow__V1__CreateKeyRequest req = KEYFLOW__V1__CREATE_KEY_REQUEST__INIT;
    req.name = (char *)name;
    req.n_grants = n;
    req.grants = ptrs;
    Keyflow__V1__CreateKeyResponse *resp = NULL;
    kf_error_t err;
    if (kf_client_create_key(cli->client, &req, &cli->arena, kf__cli_timeout_ms(cli, 0), &resp,
                             &err) != KF_OK) {
        return kf__cli_fail(&err);
    }
    rc = kf__cli_print(cli, &resp->base);
    if (rc == KF__CLI_EXIT_OK) {
        fprintf(stderr,
                "keyflow: the apiKey above is shown only now: keyflowd keeps a hash of it\n");
    }
    return rc;
}

static int cmd_list(kf__cli_t *cli, const kf__cli_args_t *args) {
    (void)args;
    Keyflow__V1__ListKeysRequest req = KEYFLOW__V1__LIST_KEYS_REQUEST__INIT;
    Keyflow__V1__ListKeysResponse *resp = NULL;
    kf_error_t err;
    if (kf_client_list_keys(cli->client, &req, &cli->arena, kf__cli_timeout_ms(cli, 0), &resp,
                            &err) != KF_OK) {
        return kf__cli_fail(&err);
    }
    return kf__cli_print(cli, &resp->base);
}

static int cmd_revoke(kf__cli_t *cli, const kf__cli_args_t *args) {
    Keyflow__V1__RevokeKeyRequest req = KEYFLOW__V1__REVOKE_KEY_REQUEST__INIT;
    req.key_id = (char *)args->positional[0];
    Keyflow__V1__RevokeKeyResponse *resp = NULL;
    kf_error_t err;
    if (kf_client_revoke_key(cli->client, &req, &cli->arena, kf__cli_timeout_ms(cli, 0), &resp,
                             &err) != KF_OK) {
        return kf__cli_fail(&err);
    }
    return kf__cli_print(cli, &resp->base);
}

static const kf__cli_command_t keys_commands[] = {
    {"create", "--name TEXT --scope SCOPE[=PREFIX] ...", "create an API key and print it once",
     "Prints {\"key\": {...}, \"apiKey\": \"kf_...\"}. The apiKey is the secret to send as\n"
     "\"authorization: Bearer <apiKey>\" (the CLI's --api-key-file, $KEYFLOW_API_KEY): keyflowd\n"
     "keeps only a keyed hash of it, so it cannot be shown again. Needs a key with keys:admin.",
     FLAGS(create_flags), 0, 0, false, cmd_create, NULL},
    {"list", "", "list the live API keys (ids, names, grants; never secrets)", NULL, NULL, 0, 0, 0,
     false, cmd_list, NULL},
    {"revoke", "KEY_ID",
     "revoke an API key: its next call is UNAUTHENTICATED, also after a restart", NULL, NULL, 0, 1,
     1, false, cmd_revoke, NULL},
};

const kf__cli_command_group_t kf__cli_keys_group = {keys_commands,
                                                    sizeof keys_commands / sizeof keys_commands[0]};
