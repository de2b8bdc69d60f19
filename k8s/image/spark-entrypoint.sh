#!/bin/sh
# Entry point of the ferry-kpi image (see Dockerfile).
#
#   spark-entrypoint driver ARGS...  Spark on Kubernetes starts the driver pod with these
#                                    arguments (Spark operator, cluster mode): submit them in
#                                    client mode bound to the pod's address.
#   spark-entrypoint executor        ... and each executor pod with settings in SPARK_* env
#                                    variables: start the executor backend with them.
#   spark-entrypoint CMD ARGS...     anything else runs as given (the CronJob runs
#                                    spark-submit --master local[N] ...).
set -eu

case "${1:-}" in
  driver)
    shift
    exec spark-submit \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS}" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=${SPARK_DRIVER_BIND_ADDRESS}" \
      --deploy-mode client \
      "$@"
    ;;
  executor)
    shift
    # JVM options arrive numbered, SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ...; keep their order
    # and any spaces inside one option.
    set --
    n=0
    while eval "[ -n \"\${SPARK_JAVA_OPT_${n}+set}\" ]"; do
      eval "set -- \"\$@\" \"\${SPARK_JAVA_OPT_${n}}\""
      n=$((n + 1))
    done
    exec java "$@" \
      "-Xms${SPARK_EXECUTOR_MEMORY}" "-Xmx${SPARK_EXECUTOR_MEMORY}" \
      -cp "${SPARK_HOME}/jars/*${SPARK_CLASSPATH:+:${SPARK_CLASSPATH}}" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL}" \
      --executor-id "${SPARK_EXECUTOR_ID}" \
      --cores "${SPARK_EXECUTOR_CORES}" \
      --app-id "${SPARK_APPLICATION_ID}" \
      --hostname "${SPARK_EXECUTOR_POD_IP}" \
      --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
      --podName "${SPARK_EXECUTOR_POD_NAME:-$(hostname)}"
    ;;
  "")
    echo "usage: spark-entrypoint driver|executor|COMMAND [ARGS...]" >&2
    exit 2
    ;;
  *)
    exec "$@"
    ;;
esac
